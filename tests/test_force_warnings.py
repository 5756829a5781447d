"""``--force`` never overrides a refusal silently: the plan's warnings (printed by a dry run and before an
apply, and in ``--json`` ``plan.warnings``) say which check it overrode and what that risks. Fast tier: a
synthetic checkpoint and sink in Spark's formats, no Spark."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from benchmarks import synthetic
from tests.synthetic_sink import write_sink
from tests.helpers import cli, cli_json

OVERRODE = "--force overrode the check that no query is running"


@pytest.fixture()
def running(tmp_path):
    """A checkpoint whose newest batch (40) was planned just now and has no commit: it looks active."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=40, partitions=2, retain_state=45, input_dir=str(tmp_path / "in"))
    write_sink(out, 40, compact_interval=10)
    shutil.copy(os.path.join(ckpt, "offsets", "39"), os.path.join(ckpt, "offsets", "40"))
    return ckpt, out


def test_without_force_the_active_query_is_refused(running):
    ckpt, out = running
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 1 and "looks active" in doc["problem"], doc


def test_force_on_an_active_query_warns_in_the_dry_run_and_the_apply(running):
    ckpt, out = running
    code, text, _ = cli("rollback", ckpt, "--to-batch", "30", "--sink", out, "--force", "--dry-run")
    assert code == 0
    assert f"warning: {OVERRODE}" in text and "offsets/40 has no commit yet" in text, text
    assert "fails at its next batch" in text, text

    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--force", "--yes")
    assert code == 0 and doc["result"] is not None, doc
    forced = [w for w in doc["plan"]["warnings"] if w.startswith(OVERRODE)]
    assert len(forced) == 1 and "offsets/40" in forced[0] and "fails at its next batch" in forced[0], doc["plan"]


def test_force_on_a_sink_output_written_just_now_warns(tmp_path):
    out = str(tmp_path / "out")
    write_sink(out, 25, compact_interval=10)  # its newest log file written just now: the query looks active
    code, doc = cli_json("sink", "compact", out)
    assert code == 1 and "looks active" in doc["problem"], doc
    code, doc = cli_json("sink", "compact", out, "--force", "--dry-run")
    assert code == 0, doc
    assert [w for w in doc["plan"]["warnings"] if w.startswith(OVERRODE) and "_spark_metadata/24" in w], doc["plan"]


def test_force_that_empties_a_sink_output_says_so(running):
    ckpt, out = running
    os.remove(os.path.join(ckpt, "offsets", "40"))  # idle: the check it overrides is the retention's own
    args = ("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "39", "--dry-run")
    code, doc = cli_json(*args)
    assert code == 1 and "drops every batch" in doc["problem"], doc
    code, doc = cli_json(*args, "--force")
    assert code == 0, doc
    assert [w for w in doc["plan"]["warnings"] if w.startswith("--force overrode a refusal: ")
            and "drops every batch" in w], doc["plan"]


def test_a_batch_an_ended_run_left_planned_is_no_sign_of_a_running_query(running):
    """The Dagster asset's run that failed mid-batch records the batch it left planned (``record_ended_run``):
    that file is no sign of a query running, and the rollback that repairs it goes ahead without ``--force``.
    Written again afterwards (by anything), it looks active again; so does a newer planned batch."""
    from checkpoint_ops.activity import record_ended_run
    from checkpoint_ops.storage import open_file_manager

    ckpt, out = running
    fm, root = open_file_manager(ckpt)
    assert record_ended_run(fm, root, "dagster run r1 (q), which failed") == "offsets/40"
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 0 and not [w for w in doc["plan"]["warnings"] if w.startswith(OVERRODE)], doc

    planned = os.path.join(ckpt, "offsets", "40")
    os.utime(planned, (os.stat(planned).st_mtime + 1, os.stat(planned).st_mtime + 1))  # written again
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 1 and "offsets/40 has no commit yet" in doc["problem"], doc

    assert record_ended_run(fm, root, "dagster run r2 (q), which failed") == "offsets/40"
    shutil.copy(os.path.join(ckpt, "offsets", "39"), os.path.join(ckpt, "offsets", "41"))  # a batch planned since
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 1 and "offsets/41 has no commit yet" in doc["problem"], doc


def test_a_rollback_just_after_a_commit_warns_that_an_idle_query_cannot_be_seen(running):
    """A query on a 2 s trigger, idle between batches, writes nothing: a hostile review rolled back under it with no
    word, and it planned its next batch over the rolled-back logs and failed. A commit younger than two minutes is
    now named in the plan's warnings (not a refusal: a query that just failed looks the same); an older one is not."""
    from checkpoint_ops.activity import RECENT_COMMIT

    ckpt, out = running
    os.remove(os.path.join(ckpt, "offsets", "40"))  # nothing planned: batch 39 committed just now
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 0, doc
    (warning,) = [w for w in doc["plan"]["warnings"] if w.startswith(RECENT_COMMIT)]
    assert "commits/39 was written less than 2 minutes ago" in warning and "stop it before going ahead" in warning
    time.sleep(1.1)  # the same words a second later: a dry run's plan, printed twice, reads the same (the fault matrix)
    assert cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")[1]["plan"]["warnings"] == \
        doc["plan"]["warnings"]
    code, text, _ = cli("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 0 and f"warning: {RECENT_COMMIT}" in text, text

    long_ago = os.path.getmtime(os.path.join(ckpt, "commits", "39")) - 600
    os.utime(os.path.join(ckpt, "commits", "39"), (long_ago, long_ago))
    code, doc = cli_json("rollback", ckpt, "--to-batch", "30", "--sink", out, "--dry-run")
    assert code == 0 and not [w for w in doc["plan"]["warnings"] if w.startswith(RECENT_COMMIT)], doc["plan"]
