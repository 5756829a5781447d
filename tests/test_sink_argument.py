"""What ``--sink`` says about a path that is no file sink's output with a log, fast tier (``benchmarks.check_pass.
Stream``: a checkpoint and its sink in Spark's formats, no Spark). An output whose ``_spark_metadata/`` is there
but empty (Spark makes it when the query starts: a query stopped before its first batch committed leaves it so)
was called "not a file-sink output" locally and "no such sink output directory" on S3 (a hostile review), for the
path the query writes to. It is named as it is now, with what to do; exit 2 and nothing changed, as before."""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks.check_pass import INTERVAL, Stream
from tests.helpers import cli, cli_json, tree_snapshot

I = ("--source-compact-interval", str(INTERVAL), "--sink-compact-interval", str(INTERVAL))


@pytest.fixture
def stream(tmp_path):
    s = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(3):
        s.batch()
    return s


@pytest.mark.parametrize("command", ["fsck", "inspect", "rollback"])
def test_an_output_whose_log_directory_is_empty_is_named_as_such(stream, command):
    shutil.rmtree(stream.out)
    os.makedirs(os.path.join(stream.out, "_spark_metadata"))
    before = tree_snapshot(stream.ckpt, stream.out)
    extra = ("--to-batch", "1", "--yes") if command == "rollback" else ()
    code, r = cli_json(command, stream.ckpt, "--sink", stream.out, *I, *extra)
    assert code == 2, r
    assert r["problem"].startswith("_spark_metadata/ is there but holds no log file"), r
    assert "leave the sink out" in r["fix"] and "restore the output from a backup" in r["fix"], r
    assert tree_snapshot(stream.ckpt, stream.out) == before


def test_other_paths_keep_their_own_words(stream, tmp_path):
    code, r = cli_json("fsck", stream.ckpt, "--sink", str(tmp_path / "nowhere"), *I)
    assert code == 2 and r["problem"].startswith("no such sink output directory"), r
    elsewhere = tmp_path / "plain"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "data.txt").write_text("x")
    code, r = cli_json("fsck", stream.ckpt, "--sink", str(elsewhere), *I)
    assert code == 2 and r["problem"].startswith("not a file-sink output"), r


def test_on_s3_an_output_with_only_its_log_directory_marker_is_named_as_such(stream, s3_server, bucket):
    import json

    import boto3

    client = boto3.client("s3", endpoint_url=s3_server)
    for key in ("out/", "out/_spark_metadata/"):  # what S3A's mkdirs leaves
        client.put_object(Bucket=bucket, Key=key, Body=b"")
    code, r = cli_json("fsck", stream.ckpt, "--sink", f"s3://{bucket}/out", *I,
                       "--storage-options", json.dumps({"endpoint_url": s3_server}))
    assert code == 2 and r["problem"].startswith("_spark_metadata/ is there but holds no log file"), r


def test_fsck_names_the_temp_file_of_a_pairing_record_write_that_never_finished(stream):
    """A command killed while it wrote the pairing record beside the sink log leaves its hidden temp file in the
    output (a hostile review: ``kill -9`` of a rollback); nothing reported or removed it. fsck names it now."""
    temp = os.path.join(stream.out, "..checkpoint-ops.pairing.json.0b3c5d6e-aaaa-bbbb-cccc-123456789abc.tmp")
    with open(temp, "w") as f:
        f.write('{"checkpoint"')
    code, r = cli_json("fsck", stream.ckpt, "--sink", stream.out, *I)
    assert code == 1 and [(f["severity"], f["code"], f["path"]) for f in r["findings"]] == \
        [("warning", "temp-file", temp)], r
    os.remove(temp)
    code, r = cli_json("fsck", stream.ckpt, "--sink", stream.out, *I)
    assert (code, r["findings"]) == (0, []), r


def test_inspect_judges_the_rollback_window_with_the_file_sinks_the_ledger_records(stream):
    """``inspect CKPT`` without ``--sink`` judged the window from the checkpoint alone, where a rollback takes the
    file sinks the batch ledger records (and refuses without them): a hostile review saw batches 0..12 offered and
    the rollback to 7 refused. The window is judged with them now, and says so."""
    code, r = cli_json("ledger", "sync", stream.ckpt, "--sink", stream.out, *I)  # records the pairing
    assert code == 0, r
    for _ in range(5):
        stream.batch()  # batches 3..7, which the ledger has not seen
    log = os.path.join(stream.out, "_spark_metadata")
    for name in ("4", ".4.crc"):
        os.remove(os.path.join(log, name))  # every batch from 4 on needs it (no compact file before 9)

    code, r = cli_json("inspect", stream.ckpt, *I)
    assert code == 0, r
    window = r["rollback_window"]
    assert window["with_recorded_sinks"] == [stream.out], window
    assert (window["earliest"], window["latest"]) == (0, 3) and "_spark_metadata/4" in window["latest_reason"], window
    code, text, _ = cli("inspect", stream.ckpt, *I)
    assert code == 0 and "rollback window with the file sinks the batch ledger records" in text, text
    code, refused = cli_json("rollback", stream.ckpt, "--to-batch", "5", "--sink", stream.out, *I, "--dry-run")
    assert code == 2 and "_spark_metadata/4" in refused["problem"], refused  # the window's word: out of reach
    code, plan = cli_json("rollback", stream.ckpt, "--to-batch", "3", "--sink", stream.out, *I, "--dry-run")
    assert code == 0, plan


def test_a_backup_without_a_file_sink_says_what_a_restore_of_it_lacks(stream, tmp_path):
    """A rollback given no sink, of a checkpoint whose ledger records none, warns; a backup said nothing (a hostile
    review), and a restore of it runs the query on into an output without the rows of every earlier batch. It says so
    now (stderr, ``--json`` ``warnings``); with the sink given, nothing."""
    dest = str(tmp_path / "dest")
    code, out, err = cli("backup", "create", stream.ckpt, dest, *I)
    assert code == 0 and "warning: no file sink given, and the batch ledger records none" in err, err
    assert "a restore of it runs the query on from batch 3 into an output without the rows of the batches up to 2" \
        in err, err
    code, r = cli_json("backup", "create", stream.ckpt, dest, *I)
    assert code == 0 and [w for w in r["warnings"] if w.startswith("no file sink given")], r["warnings"]
    code, r = cli_json("backup", "create", stream.ckpt, dest, "--sink", stream.out, *I)
    assert code == 0 and r["warnings"] == [], r["warnings"]


def test_history_of_an_output_names_the_checkpoint_its_operations_are_journaled_with(stream):
    """``history OUTPUT`` lists what ran on the output alone; a rollback with its checkpoint is journaled beside the
    checkpoint, and a hostile review read "0 operation(s) journaled" as "nothing ever changed it". The output's
    pairing record names its checkpoint: history says where to look."""
    stream.batch()
    code, r = cli_json("rollback", stream.ckpt, "--to-batch", "1", "--sink", stream.out, *I, "--yes")
    assert code == 0, r  # records the pairing on both sides once applied
    code, h = cli_json("history", stream.out)
    assert code == 0 and h["operations"] == [] and h["journaled_with_checkpoint"] == stream.ckpt, h
    code, text, _ = cli("history", stream.out)
    assert code == 0 and f"`checkpoint-ops history {stream.ckpt}`" in text, text
    code, h = cli_json("history", stream.ckpt)
    assert [e["operation"] for e in h["operations"]] == ["rollback"] and "journaled_with_checkpoint" not in h, h


def test_a_sink_plan_names_the_batch_its_log_is_at_not_a_target(stream):
    """``sink retain --keep-after-batch 0`` printed "Plan ... (sink-retain to batch 2)", read as a target (a hostile
    review): the batch is where the sink log is, and the plan says so."""
    code, text, err = cli("sink", "retain", stream.out, "--checkpoint", stream.ckpt, "--keep-after-batch", "0", *I,
                          "--dry-run")
    assert code == 0, err
    assert "(sink-retain, sink log at batch 2)" in text and "to batch" not in text.splitlines()[0], text


def test_fsck_of_a_lost_data_file_names_the_command_that_drops_its_entry_and_it_works(tmp_path):
    """fsck said "the sink log must be rewritten without it" and no command (a hostile review). It names `sink
    compact --drop-missing`, and that command, run as named, leaves fsck with nothing to say. Before the sink log's
    first compact file the command has nothing to rewrite: fsck says it works from that file on."""
    young = Stream(str(tmp_path / "young"), retain=100)
    for _ in range(3):
        young.batch()
    os.remove(os.path.join(young.out, "part-000001-c0ffee.snappy.parquet"))
    code, r = cli_json("fsck", young.ckpt, "--sink", young.out, *I)
    (missing,) = [f for f in r["findings"] if f["code"] == "sink-file-missing"]
    assert code == 1 and "once Spark has written the sink log's first compact file (_spark_metadata/9.compact)" \
        in missing["fix"], missing
    young.batch()
    code, r = cli_json("rollback", young.ckpt, "--to-batch", "2", "--sink", young.out, *I, "--dry-run")
    assert code == 2 and "part-000001" in r["problem"], r  # a rollback needs it: refused, with the same word
    assert "once Spark has written the sink log's first compact file, _spark_metadata/9.compact" in r["fix"], r

    stream = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(13):
        stream.batch()
    lost = "part-000003-c0ffee.snappy.parquet"
    for name in (lost, f".{lost}.crc"):
        os.remove(os.path.join(stream.out, name))
    code, r = cli_json("fsck", stream.ckpt, "--sink", stream.out, *I)
    (missing,) = [f for f in r["findings"] if f["code"] == "sink-file-missing"]
    command = f"checkpoint-ops sink compact {stream.out} --drop-missing"
    assert code == 1 and f"drop its entry from the sink log (`{command}`" in missing["fix"], missing
    code, done = cli_json(*command.split()[1:], *I, "--yes")
    assert code == 0, done
    code, r = cli_json("fsck", stream.ckpt, "--sink", stream.out, *I)
    assert (code, r["findings"]) == (0, []), r["findings"]


def test_a_rollback_beyond_spark_s_cleanup_names_the_files_gone_once(tmp_path):
    """Spark's cleanup after the compaction at 9 left ``_spark_metadata/0..8`` gone: the refusal of a rollback to 7
    said "... is gone and cannot be rebuilt (...)" eight times (a hostile review). Said once, with the range."""
    stream = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(13):
        stream.batch()
    log = os.path.join(stream.out, "_spark_metadata")
    for b in range(9):
        for name in (str(b), f".{b}.crc"):
            os.remove(os.path.join(log, name))
    before = tree_snapshot(stream.ckpt, stream.out)
    code, r = cli_json("rollback", stream.ckpt, "--to-batch", "7", "--sink", stream.out, *I, "--yes")
    assert code == 1 and "_spark_metadata/0 .. _spark_metadata/7 (8 files) are gone and cannot be rebuilt" \
        in r["problem"], r
    assert r["problem"].count("cannot be rebuilt") == 1 and "The earliest reachable batch is 9" in r["problem"], r
    assert tree_snapshot(stream.ckpt, stream.out) == before


def test_with_the_wrong_sink_compact_interval_the_window_offers_only_what_the_rollback_takes(tmp_path):
    """The log was written with interval 10 (``9.compact``, ``19.compact``); ``--sink-compact-interval 3`` is not the
    query's. A rollback below 19 leaves ``9.compact`` alone (Spark derives 5 from it) or none (Spark reads with 3):
    refused, and the window offered those batches all the same (a review of the window's interval check). It ends at
    19 now, saying to pass the query's interval; with it, everything is offered, and taken."""
    stream = Stream(str(tmp_path / "q"), retain=100)
    for _ in range(23):
        stream.batch()
    wrong = ("--source-compact-interval", "10", "--sink-compact-interval", "3")
    code, r = cli_json("inspect", stream.ckpt, "--sink", stream.out, *wrong)
    window = r["rollback_window"]
    assert code == 0 and (window["earliest"], window["latest"]) == (19, 22), window
    assert "would derive compact interval 5 from it" in window["earliest_reason"], window
    before = tree_snapshot(stream.ckpt, stream.out)
    for target, said in (("15", "its first, and Spark would derive compact interval 5"),
                         ("5", "with compact interval 3 (no compact file yet: compactInterval 3) and miss "
                               "_spark_metadata/5.compact")):
        code, refused = cli_json("rollback", stream.ckpt, "--to-batch", target, "--sink", stream.out, *wrong, "--yes")
        assert code == 1 and said in refused["problem"] and "--sink-compact-interval" in refused["fix"], refused
        assert "-1.compact" not in refused["problem"], refused
    assert tree_snapshot(stream.ckpt, stream.out) == before
    # interval 5: 9.compact alone still derives 10, so 9..18 are taken; below 9 no compact file is left, Spark reads
    # the log with 5 and misses 4.compact
    five = ("--source-compact-interval", "10", "--sink-compact-interval", "5")
    code, r = cli_json("inspect", stream.ckpt, "--sink", stream.out, *five)
    window = r["rollback_window"]
    assert code == 0 and (window["earliest"], window["latest"]) == (9, 22), window
    assert "with compact interval 5" in window["earliest_reason"] and "_spark_metadata/4.compact" \
        in window["earliest_reason"], window
    code, refused = cli_json("rollback", stream.ckpt, "--to-batch", "8", "--sink", stream.out, *five, "--dry-run")
    assert code == 1 and "miss _spark_metadata/4.compact" in refused["problem"], refused
    code, plan = cli_json("rollback", stream.ckpt, "--to-batch", "9", "--sink", stream.out, *five, "--dry-run")
    assert code == 0, plan
    code, r = cli_json("inspect", stream.ckpt, "--sink", stream.out, *I)
    assert code == 0 and r["rollback_window"]["earliest"] == 0, r["rollback_window"]
    code, done = cli_json("rollback", stream.ckpt, "--to-batch", "5", "--sink", stream.out, *I, "--yes")
    assert code == 0, done
