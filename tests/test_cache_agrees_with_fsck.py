"""The verdict cache, the window memo and the health check's fingerprint change no verdict: after passes
that warmed them, a change on disk is found by the next pass (and by ``shared_fsck``) exactly as by
fsck and inspect without any cache. Each case here is one a hostile review found the cache missing.
Fast tier: ``benchmarks.check_pass.Stream`` (a checkpoint and its file sink in Spark's formats), no Spark."""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks import synthetic
from benchmarks.check_pass import Stream
from checkpoint_ops.check_pass import run_check_pass, shared_fsck
from checkpoint_ops.fsck import run_fsck
from checkpoint_ops.inspect import inspect_checkpoint
from checkpoint_ops.ledger import Ledger
from checkpoint_ops.ledger import sync as sync_ledger
from checkpoint_ops.model.checkpoint import Checkpoint, open_sink
from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_name

BATCHES = 30


@pytest.fixture()
def stream(tmp_path):
    s = Stream(str(tmp_path), retain=100)
    for _ in range(BATCHES):
        s.batch()
    return s


def _model(s: Stream, with_sink: bool = True):
    return Checkpoint.open(s.ckpt), ([open_sink(s.out)] if with_sink else [])


def _keys(findings) -> list[tuple[str, str, str]]:
    return [(f["severity"], f["code"], f["path"]) for f in findings]


def _without_cache(s: Stream, with_sink: bool = True):
    ckpt, sinks = _model(s, with_sink)
    findings = [f.to_dict() for f in run_fsck(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))]
    ckpt, sinks = _model(s, with_sink)
    return _keys(findings), inspect_checkpoint(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt), batches=False)


def _pass(s: Stream, with_sink: bool = True):
    ckpt, sinks = _model(s, with_sink)
    got = run_check_pass(ckpt, sinks, sync=False, batches=False)
    return got, _keys(f.to_dict() for f in got.findings), got.report


def _shared(s: Stream, with_sink: bool = True):
    ckpt, sinks = _model(s, with_sink)
    return _keys(f.to_dict() for f in shared_fsck(ckpt, sinks))


def _write_with_sidecar(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    folder, name = os.path.split(path)
    with open(os.path.join(folder, hadoop_crc_name(name)), "wb") as f:
        f.write(hadoop_crc_bytes(data))


def test_a_state_schema_file_cut_short_after_warm_passes_closes_the_window(stream):
    """Every batch's restart set reads the store's v1/v2 schema file (``state/0/0/_metadata/schema``): the
    memo's digest covers it (it left out every file under a store's subdirectories)."""
    _with_state(stream)
    schema = os.path.join(stream.ckpt, "state/0/0/_metadata/schema")
    assert os.path.exists(schema)
    _pass(stream)
    warm, _, report = _pass(stream)
    assert warm.window_hits > 0 and report["rollback_window"]["earliest"] == 0  # the memo answered
    data = open(schema, "rb").read()
    _write_with_sidecar(schema, data[: len(data) // 2])  # a bad copy, with a sidecar that matches it
    want_findings, want_report = _without_cache(stream)
    assert want_report["rollback_window"]["earliest"] is None  # no batch can restart
    _, findings, report = _pass(stream)
    assert report["rollback_window"] == want_report["rollback_window"]
    assert findings == want_findings


@pytest.mark.parametrize("rel", ["_spark_metadata/025", "sources/0/025", "offsets/015"])
def test_a_directory_named_like_an_old_log_file_is_judged_again(stream, rel):
    """Spark lists ``025`` as batch 25 (and reads batch 25 from ``25``): the memo hashes a log directory's
    subdirectories named like log files too (it hashed files only). The model took the directory for batch 25's
    file (which cut the window); now it keeps ``25`` and fsck names the directory as misnamed."""
    _pass(stream)
    _pass(stream)
    where = os.path.join(stream.out if rel.startswith("_spark") else stream.ckpt, rel)
    os.mkdir(where)
    want_findings, want_report = _without_cache(stream)
    assert ("error", "misnamed-batch-file", where) in want_findings, want_findings
    _, findings, report = _pass(stream)
    assert report["rollback_window"] == want_report["rollback_window"]
    assert findings == want_findings


@pytest.mark.parametrize("rel", ["commits/30", "offsets/31", "_spark_metadata/31"])
def test_the_health_check_sees_an_empty_directory_where_a_log_file_goes(stream, rel):
    """The fingerprint the health check reuses a pass's findings by covers the listing's empty directories."""
    _pass(stream)
    assert _shared(stream) == _without_cache(stream)[0] == []
    os.mkdir(os.path.join(stream.out if rel.startswith("_spark") else stream.ckpt, rel))
    want = _without_cache(stream)[0]
    assert ("error", "unreadable-file", os.path.join(stream.out if rel.startswith("_spark") else stream.ckpt, rel)) in want
    assert _shared(stream) == want


def test_a_recorded_sink_not_given_is_in_the_health_checks_fingerprint(stream):
    """fsck judges the output the ledger records though it was not given; the health check's fingerprint
    covers that output too (it covered only the sinks given)."""
    ckpt, sinks = _model(stream)
    sync_ledger(ckpt, sinks)  # records the pairing, as `ledger sync --sink` does
    _pass(stream, with_sink=False)
    assert _shared(stream, with_sink=False) == []
    data_file = os.path.join(stream.out, "part-000012-c0ffee.snappy.parquet")
    os.remove(data_file)
    want = _without_cache(stream, with_sink=False)[0]
    assert ("error", "sink-file-missing", data_file) in want
    assert _shared(stream, with_sink=False) == want


def test_the_pass_judges_the_window_again_with_a_recorded_sink(stream):
    """In one pass, inspect's window (the sinks given) is not fsck's when fsck adds a recorded output:
    fsck judges it with that output (no cache needed to see this)."""
    ckpt, sinks = _model(stream)
    sync_ledger(ckpt, sinks)
    # an old sink-log file (below the newest compact file, which the latest readers read instead) names a data
    # file that is not there: only a rollback to its batch would make readers read it
    log = os.path.join(stream.out, "_spark_metadata", "15")
    gone = os.path.join(stream.out, "part-999999-gone.snappy.parquet")
    body = open(log, "rb").read() + (b'\n{"path":"file://%s","size":1,"isDir":false,"modificationTime":1,'
                                     b'"blockReplication":1,"blockSize":1,"action":"add"}' % gone.encode())
    open(log, "wb").write(body)
    open(os.path.join(stream.out, "_spark_metadata", hadoop_crc_name("15")), "wb").write(hadoop_crc_bytes(body))
    want_findings, want_report = _without_cache(stream, with_sink=False)
    assert ("warning", "window-cut", gone) in want_findings, want_findings
    _, findings, report = _pass(stream, with_sink=False)
    assert findings == want_findings
    assert report == want_report


def test_a_state_partition_deleted_whole_after_warm_passes_closes_the_window(stream):
    """A partition's state directory deleted whole leaves no file whose verdict could change: the memo's
    context covers the store directories, and the pass names the directory as fsck without a cache does."""
    _with_state(stream)
    _pass(stream)
    warm, _, report = _pass(stream)
    assert warm.window_hits > 0 and report["rollback_window"]["earliest"] == 0
    shutil.rmtree(os.path.join(stream.ckpt, "state/0/0"))
    want_findings, want_report = _without_cache(stream)
    assert ("error", "state-missing", os.path.join(stream.ckpt, "state/0/0")) in want_findings
    assert want_report["rollback_window"]["earliest"] is None
    _, findings, report = _pass(stream)
    assert (findings, report["rollback_window"]) == (want_findings, want_report["rollback_window"])
    assert _shared(stream) == want_findings


def _with_state(s: Stream) -> None:
    for rel, data in synthetic.files(batches=BATCHES, partitions=1, retain_state=BATCHES):
        if rel.startswith("state/"):
            path = os.path.join(s.ckpt, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write_with_sidecar(path, data)


def test_a_state_file_of_a_far_version_costs_one_entry_of_the_memo(stream):
    """A stray delta of version 1,000,000 beside versions 1..30 (as a removed operator's leftovers beside a
    long-running query): the memo's state table holds the versions present, not every version between
    (it held a million entries here, and tens of GB for a 10-digit version), and the answers are fsck's."""
    from checkpoint_ops.verdicts import VerdictCache
    from checkpoint_ops.window_memo import WindowMemo

    _with_state(stream)
    _write_with_sidecar(os.path.join(stream.ckpt, "state/0/0/1000000.delta"), synthetic.lz4_block_stream(b"stray"))
    _pass(stream)
    warm, findings, report = _pass(stream)
    want_findings, want_report = _without_cache(stream)
    assert ("warning", "state-stale", os.path.join(stream.ckpt, "state/0/0/1000000.delta")) in want_findings
    assert warm.window_hits > 0
    assert findings == want_findings and report == want_report
    ckpt, sinks = _model(stream)
    memo = WindowMemo(ckpt, sinks, VerdictCache.for_checkpoint(ckpt))
    versions = {f.version for store in ckpt.state.stores() for f in store.files}
    assert len(memo._state_prefix) == len(versions) + 1


def test_the_first_pass_reports_the_pairing_its_own_sync_recorded(stream):
    """The pass's ledger sync writes the sink's pairing record after the sink was listed: the pass's inspect
    reports it as inspect does afterwards (it reported the ledger's side only, on the first pass)."""
    ckpt, sinks = _model(stream)
    got = run_check_pass(ckpt, sinks, sync=True, batches=False)
    assert os.path.exists(os.path.join(stream.out, ".checkpoint-ops.pairing.json"))
    want_findings, want_report = _without_cache(stream)
    assert "sink" in want_report["sink"]["pairing"]["recorded"]
    assert got.report == want_report
    assert _keys(f.to_dict() for f in got.findings) == want_findings


@pytest.mark.parametrize("name", ["offsets/+29", "commits/029", "_spark_metadata/+29", "sources/0/029"])
def test_a_copy_under_a_name_spark_misreads_is_found_after_warm_passes(stream, name):
    """``offsets/+29`` beside ``offsets/29``: Spark lists it as batch 29 and never reads it (a stray; a rollback
    refuses it). The passes that warmed the cache and the health check's fingerprint must see it appear."""
    _pass(stream)
    assert _shared(stream) == []
    root = stream.out if name.startswith("_spark") else stream.ckpt
    log, _, wrong = name.rpartition("/")
    right = str(int(wrong))
    names = os.listdir(os.path.join(root, log))
    right = right if right in names else f"{right}.compact" if f"{right}.compact" in names else \
        max((n for n in names if not n.startswith(".")), key=lambda n: int(n.split(".")[0]))
    shutil.copy2(os.path.join(root, log, right), os.path.join(root, name))
    want = _without_cache(stream)[0]
    assert ("error", "misnamed-batch-file", os.path.join(root, name)) in want, want
    _, findings, _ = _pass(stream)
    assert findings == want
    assert _shared(stream) == want
