"""A log entry whose name Spark parses as a batch but is not that batch's name (``offsets/+0``, ``_spark_metadata/
+24``): what Spark does with each is proven in ``test_misnamed_batch_files_spark.py``; here, the commands that
change a sink log refuse, on local disk and S3 alike, and a checkpoint holding only ``offsets/+0`` is named as
what it is. Fast tier: ``benchmarks.check_pass.Stream``, no Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import boto3
import pytest
import s3fs

from benchmarks.check_pass import INTERVAL
from tests.helpers import cli, cli_json, tree_snapshot
from tests.test_rollback_directory_as_batch import I, _stream


@pytest.mark.parametrize("command", [
    ["sink", "compact"],
    ["sink", "retain", "--keep-after-batch", "20"],
    ["sink", "orphans", "--min-age", "0s", "--delete"],
])
def test_a_misnamed_sink_log_file_stops_every_change_to_the_sink_log(tmp_path, command):
    s = _stream(str(tmp_path))
    log = os.path.join(s.out, "_spark_metadata")
    newest = max((n for n in os.listdir(log) if not n.startswith(".")), key=lambda n: int(n.split(".")[0]))
    shutil.copy2(os.path.join(log, newest), os.path.join(log, "+" + newest))
    before = tree_snapshot(s.ckpt, s.out)
    code, r = cli_json(*command[:2], s.out, "--checkpoint", s.ckpt, "--sink-compact-interval", str(INTERVAL),
                       *command[2:], "--yes")
    assert code == 2, r
    assert r["path"] == os.path.join(log, "+" + newest) and " is there: Spark reads no batch from this one" in r["problem"], r
    assert "the change to the sink log is refused, nothing was changed" in r["problem"], r
    assert tree_snapshot(s.ckpt, s.out) == before


def test_offsets_plus_0_alone_is_named_not_taken_for_a_new_query(tmp_path):
    """Spark lists ``offsets/+0`` as batch 0 (so it is no new query) and fails to read ``offsets/0``; fsck said the
    location blocks a new query (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), which Spark never gets to."""
    s = _stream(str(tmp_path), batches=1)
    for name in os.listdir(s.ckpt):
        if name not in ("metadata", "offsets"):
            shutil.rmtree(os.path.join(s.ckpt, name))
    for old, new in (("0", "+0"), (".0.crc", ".+0.crc")):
        os.rename(os.path.join(s.ckpt, "offsets", old), os.path.join(s.ckpt, "offsets", new))
    code, r = cli_json("fsck", s.ckpt)
    assert code == 1, r
    assert [(f["code"], os.path.basename(f["path"])) for f in r["findings"]] == [("misnamed-batch-file", "+0")], r
    assert "File offsets/0 does not exist" in r["findings"][0]["problem"], r
    assert "rename it to offsets/0" in r["findings"][0]["fix"], r


def test_on_s3_a_misnamed_offsets_file_is_named_and_the_rollback_refused(tmp_path, s3_server, bucket):
    s = _stream(str(tmp_path))
    os.rename(os.path.join(s.ckpt, "offsets", "24"), os.path.join(s.ckpt, "offsets", "024"))
    s3fs.S3FileSystem(endpoint_url=s3_server).put(s.ckpt + "/", f"{bucket}/ckpt", recursive=True)
    where = f"s3://{bucket}/ckpt"
    code, r = cli_json("fsck", where, *I)
    assert code == 1 and [f["path"] for f in r["findings"] if f["code"] == "misnamed-batch-file"] == \
        [f"{where}/offsets/024"], r
    keys = sorted(o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket=bucket, Prefix="ckpt/")["Contents"])
    code, r = cli_json("rollback", where, "--to-batch", "20", *I, "--yes")
    assert code == 2 and r["path"] == f"{where}/offsets/024" and "which is missing" in r["problem"], r
    assert sorted(o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket=bucket, Prefix="ckpt/")["Contents"]) == keys


def _kept(s, batches: int = 25):
    """A stream whose logs keep only their newest 10 batches, as Spark's retention leaves them."""
    from benchmarks.check_pass import Stream

    stream = Stream(s, retain=10)
    for _ in range(batches):
        stream.batch()
    return stream


def test_a_stray_below_every_kept_batch_is_a_warning_and_stops_nothing(tmp_path):
    """``offsets/05`` and ``commits/05`` where the logs keep 15..24: Spark restarts over them (and a sink log's)
    exactly (a hostile review, with Spark); fsck called each an error ("the query fails to start"), and rollback,
    compat and the sink commands refused. ``ledger sync`` crashed (it read ``offsets/5``)."""
    s = _kept(str(tmp_path))
    strays = [os.path.join(s.ckpt, "offsets", "05"), os.path.join(s.ckpt, "commits", "05")]
    for path in strays:
        shutil.copy2(os.path.join(os.path.dirname(path), "24"), path)
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert code == 1 and sorted((f["severity"], f["code"], f["path"]) for f in r["findings"]) == \
        sorted(("warning", "misnamed-batch-file", p) for p in strays), r
    assert all("below every batch this log keeps" in f["problem"] for f in r["findings"]), r
    code, out, err = cli("ledger", "sync", s.ckpt, "--sink", s.out, *I)
    assert code == 0 and "Traceback" not in err, err
    code, r = cli_json("sink", "compact", s.out, "--checkpoint", s.ckpt, "--sink-compact-interval", str(INTERVAL),
                       "--yes")
    assert code == 0, r
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--yes")
    assert code == 0, r
    assert all(os.path.exists(p) for p in strays)  # below the target: not the rollback's to move


def test_a_misnamed_newest_offsets_file_is_not_backed_up(tmp_path):
    """``backup create``, ``verify`` and ``restore`` passed ``offsets/024`` (``offsets/24`` missing), and Spark
    then failed at the restored copy (a hostile review, with Spark)."""
    s = _stream(str(tmp_path / "q"))
    os.rename(os.path.join(s.ckpt, "offsets", "24"), os.path.join(s.ckpt, "offsets", "024"))
    code, r = cli_json("backup", "create", s.ckpt, str(tmp_path / "dest"), "--sink", s.out, *I)
    assert code == 2 and r["path"].endswith("offsets/024") and "nothing was backed up" in r["problem"], r
    assert not os.path.exists(tmp_path / "dest") or not os.listdir(tmp_path / "dest" / "manifests")


@pytest.mark.parametrize("name", ["\U0001d7d1\U0001d7d0", "²"])
def test_digits_java_does_not_read_are_not_batches(tmp_path, name):
    """``offsets/𝟑𝟐`` (digits outside the basic plane: two UTF-16 units each, which Java's ``parseLong`` refuses) and
    ``offsets/²`` are no batch to Spark, which resumes over them (a hostile review, with Spark); the first was
    called misnamed and a running batch 32."""
    s = _stream(str(tmp_path))
    shutil.copy2(os.path.join(s.ckpt, "offsets", "24"), os.path.join(s.ckpt, "offsets", name))
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert (code, r["findings"]) == (0, []), r
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--yes")
    assert code == 0, r


@pytest.mark.parametrize("where", ["state/0/0/².delta", "state/²/0/1.delta", "log"])
def test_a_superscript_digit_in_a_state_name_or_a_version_line_is_no_crash(tmp_path, where):
    """``str.isdigit`` takes "²" for a digit and ``int`` refuses it: fsck, inspect, rollback and backup create
    ended in a ValueError traceback (exit 3; a hostile review)."""
    s = _stream(str(tmp_path / "q"))
    if where == "log":
        path = os.path.join(s.ckpt, "commits", "10")
        data = open(path, "rb").read().split(b"\n", 1)
        open(path, "wb").write("v²".encode() + b"\n" + data[1])
    else:
        os.makedirs(os.path.dirname(os.path.join(s.ckpt, where)), exist_ok=True)
        open(os.path.join(s.ckpt, where), "w").write("x")
    for args in (["fsck", s.ckpt, *I], ["inspect", s.ckpt, *I],
                 ["rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--dry-run"],
                 ["backup", "create", s.ckpt, str(tmp_path / "dest"), "--sink", s.out, *I]):
        code, out, err = cli(*args)
        assert code in (0, 1, 2) and "Traceback" not in err, (args, code, err[-2000:])


def test_a_misnamed_compact_file_beside_a_plain_one_says_move_it_out(tmp_path):
    """``_spark_metadata/020.compact`` beside a plain ``20`` (a review): the fix said to rename it to ``20.compact``,
    which leaves Spark working out another compact interval and failing. Batch 20's file is there: move it out."""
    s = _stream(str(tmp_path))
    log = os.path.join(s.out, "_spark_metadata")
    plain = next(str(b) for b in range(24, 0, -1) if os.path.exists(os.path.join(log, str(b))))
    shutil.copy2(os.path.join(log, plain), os.path.join(log, f"0{plain}.compact"))
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    found = [f for f in r["findings"] if f["code"] == "misnamed-batch-file"]
    assert code == 1 and len(found) == 1 and found[0]["severity"] == "error", r
    assert f"_spark_metadata/{plain} is there" in found[0]["problem"] and found[0]["fix"].startswith("move "), found


def test_a_stray_state_name_beside_spark_s_own_is_a_warning_and_stops_nothing(tmp_path):
    """``state/00`` beside ``state/0``: Spark reads ``state/0`` and never ``state/00``; it was an error that stopped
    rollback and backup "as neither could tell which is Spark's" (review 2), while the message named Spark's."""
    s = _stream(str(tmp_path / "q"))
    os.makedirs(os.path.join(s.ckpt, "state", "00", "0"))
    open(os.path.join(s.ckpt, "state", "00", "0", "1.delta"), "wb").close()
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert code == 1 and [(f["severity"], f["code"]) for f in r["findings"]] == \
        [("warning", "misnamed-state-file")], r
    assert "state/0 is there: a stray Spark never reads" in r["findings"][0]["problem"], r
    code, r = cli_json("rollback", s.ckpt, "--to-batch", "20", "--sink", s.out, *I, "--dry-run")
    assert code == 0, r


def _cli_killed(at: int, *args) -> int:
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT=str(at))
    env.pop("PYTHONPATH", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", *map(str, args)], env=env, cwd=root,
                          capture_output=True, text=True).returncode


def test_a_killed_undo_of_a_sink_command_run_without_its_checkpoint_is_named_as_the_outputs_own(tmp_path):
    """``sink compact OUT``, then its ``undo OUT`` killed part-way: the next ``sink compact OUT`` said the undo's
    journal was beside a checkpoint and told the user to pass one (which took the lease over and compacted under
    the unfinished undo; review 2). It names ``resume OUT`` now, which ends it."""
    s = _stream(str(tmp_path / "q"))
    compact = ["sink", "compact", s.out, "--sink-compact-interval", str(INTERVAL)]
    assert cli_json(*compact, "--yes")[0] == 0
    assert _cli_killed(20, "undo", s.out, "--yes") == -9
    code, r = cli_json(*compact, "--dry-run")
    assert code == 1 and f"checkpoint-ops resume {s.out}" in r["fix"] and "--checkpoint" not in r["fix"], r
    assert cli_json("resume", s.out, "--yes")[0] == 0  # rolls the compaction forward again
    code, r = cli_json("fsck", s.ckpt, "--sink", s.out, *I)
    assert not [f for f in r["findings"] if f["severity"] == "error"], r
    assert cli_json(*compact, "--dry-run")[0] == 0  # the lease is free again


def test_a_rollback_killed_before_it_journaled_leaves_an_output_its_checkpoint_frees(tmp_path):
    """The rollback took both leases and died before its journal: ``resume CKPT``, the first fix offered, says
    nothing to resume and leaves the output's lease (review 2). The fix names ``--checkpoint`` first, which takes
    the dead lease over."""
    s = _stream(str(tmp_path / "q"))
    assert _cli_killed(5, "rollback", s.ckpt, "--to-batch", "12", "--sink", s.out, *I, "--yes") == -9
    compact = ["sink", "compact", s.out, "--sink-compact-interval", str(INTERVAL)]
    code, r = cli_json(*compact, "--dry-run")
    assert code == 1 and r["fix"].startswith("run this again with --checkpoint CKPT"), r
    code, r = cli_json(*compact, "--checkpoint", s.ckpt, "--dry-run")
    assert code == 0, r


def test_a_sink_command_run_without_its_checkpoint_and_killed_stops_the_next_until_it_is_resumed(tmp_path):
    """``sink compact OUT`` killed part-way (journaled beside the output; nothing is fenced without a checkpoint):
    the next ``sink compact OUT`` took the dead lease over and applied over the unfinished journal (review 2)."""
    s = _stream(str(tmp_path / "q"))
    compact = ["sink", "compact", s.out, "--sink-compact-interval", str(INTERVAL)]
    assert _cli_killed(20, *compact, "--yes") == -9
    before = tree_snapshot(s.out)
    code, r = cli_json(*compact, "--yes")
    assert code == 1 and "stopped part-way" in r["problem"] and f"checkpoint-ops resume {s.out}" in r["fix"], r
    assert tree_snapshot(s.out) == before
    assert cli_json("resume", s.out, "--yes")[0] == 0
    code, r = cli_json(*compact, "--dry-run")
    assert code == 0, r
