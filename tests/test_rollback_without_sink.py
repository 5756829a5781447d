"""A rollback given no file sink, of a checkpoint whose batch ledger records none: nothing says whether the query
writes one. If it does, the output keeps the sink log of the rolled-back batches and Spark's file sink skips
those batch ids when they run again, so the reprocessed rows never reach it (a hostile review lost the fixed
rows of a bad input file this way, with no word from the tool). The plan warns, in the dry run and the apply.
Fast tier: a synthetic checkpoint and sink in Spark's formats (benchmarks/synthetic.py), no Spark."""

from __future__ import annotations

from benchmarks import synthetic
from tests.helpers import cli_json
from tests.synthetic_sink import write_sink

WARNING = "no file sink given, and the batch ledger records none for this checkpoint"


def test_a_rollback_without_a_sink_warns_when_nothing_records_one(tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=20, partitions=2, retain_state=25, input_dir=str(tmp_path / "in"))
    write_sink(out, 20, compact_interval=10)
    code, doc = cli_json("rollback", ckpt, "--to-batch", "12", "--dry-run")
    assert code == 0, doc
    (warning,) = [w for w in doc["plan"]["warnings"] if w.startswith(WARNING)]
    assert "--sink OUTPUT_PATH" in warning and "batches after 12" in warning, warning
    # nothing says it is a file sink: a foreachBatch or Kafka sink gets batches 13..19 again
    assert "if it writes another sink (foreachBatch, Kafka)" in warning and "batches 13..19 run again" in warning
    code, doc = cli_json("rollback", ckpt, "--to-batch", "12", "--yes")
    assert code == 0 and [w for w in doc["plan"]["warnings"] if w.startswith(WARNING)], doc["plan"]["warnings"]


def test_no_warning_when_the_sink_is_given(tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    synthetic.write_local(ckpt, batches=20, partitions=2, retain_state=25, input_dir=str(tmp_path / "in"))
    write_sink(out, 20, compact_interval=10)
    code, doc = cli_json("rollback", ckpt, "--to-batch", "12", "--sink", out, "--dry-run")
    assert code == 0, doc
    assert not [w for w in doc["plan"]["warnings"] if w.startswith(WARNING)], doc["plan"]["warnings"]


def _recorded(ckpt: str, sink) -> None:
    """A query profile beside the checkpoint, as `compat --record` or a Dagster run records one."""
    from checkpoint_ops.query_profile import QueryProfile, SinkProfile, record_profile
    from checkpoint_ops.storage import open_file_manager

    fm, root = open_file_manager(ckpt)
    record_profile(fm, root, QueryProfile("append", sink, None, None, None, "4.3.0"), False, 19)


def test_the_warning_names_the_sink_the_profile_records_or_says_other_sinks_get_the_batches_again(tmp_path):
    from checkpoint_ops.query_profile import SinkProfile, profile_path
    from checkpoint_ops.storage import open_file_manager

    ckpt = str(tmp_path / "ckpt")
    synthetic.write_local(ckpt, batches=20, partitions=2, retain_state=25, input_dir=str(tmp_path / "in"))
    _recorded(ckpt, SinkProfile("file", "parquet", "/data/tables/events"))
    code, doc = cli_json("rollback", ckpt, "--to-batch", "12", "--dry-run")
    (warning,) = [w for w in doc["plan"]["warnings"] if w.startswith(WARNING)]
    assert "writes a file sink at /data/tables/events: pass --sink /data/tables/events" in warning, warning
    assert "foreachBatch, Kafka" not in warning  # the profile says file sink: nothing is handed out again

    for kind in ("kafka", "foreachBatch"):  # a sink a rollback cannot change: its batches are delivered again
        _recorded(ckpt, SinkProfile(kind, kind, None))
        code, doc = cli_json("rollback", ckpt, "--to-batch", "12", "--dry-run")
        assert code == 0 and not [w for w in doc["plan"]["warnings"] if w.startswith(WARNING)], doc
        (again,) = [w for w in doc["plan"]["warnings"] if "a second time" in w]
        assert again.startswith(f"the query's recorded profile says it writes a {kind} sink"), again
        assert "batches 13..19 run again" in again and "idempotent per batch id" in again, again

    fm, root = open_file_manager(ckpt)
    with open(profile_path(fm, root), "wb") as f:
        f.write(b'{"format": 1, "prof')  # torn: the hint is generic, the rollback is not refused
    code, doc = cli_json("rollback", ckpt, "--to-batch", "12", "--dry-run")
    assert code == 0, doc
    (warning,) = [w for w in doc["plan"]["warnings"] if w.startswith(WARNING)]
    assert "--sink OUTPUT_PATH" in warning, warning
