"""The verdict cache changes no verdict: on a real Spark checkpoint with damage in it, a pass with the
cache cold, warm, deleted or damaged finds exactly what fsck and inspect find without it; a file
rewritten after its verdict was cached is judged again, and so is the newest file of a log even when
its size and mtime are kept."""

from __future__ import annotations

import json
import os
import re
import threading

import pytest

import checkpoint_ops
from checkpoint_ops.check_pass import run_check_pass, shared_fsck
from checkpoint_ops.fsck import run_fsck
from checkpoint_ops.inspect import inspect_checkpoint
from checkpoint_ops.journal import ops_dir
from checkpoint_ops.ledger import Ledger
from checkpoint_ops.ledger import sync as sync_ledger
from checkpoint_ops.model.checkpoint import Checkpoint, open_sink
from checkpoint_ops.storage import open_file_manager
from checkpoint_ops.storage.checksums import hadoop_crc_bytes
from checkpoint_ops.verdicts import FORMAT, VerdictCache, tool_build
from tests.helpers import tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL

_LOG_NAME = re.compile(r"^\.?(\d+)(\.compact)?(\.crc)?$")


@pytest.fixture
def hdfs_run(spark_runs):
    """The HDFS checkpoint with its log files' mtimes spread out (10 s per batch id, as a query that runs
    now and then leaves them): Spark wrote every file of a test run within seconds, so all of them would
    count as possibly still being rewritten (``verdicts.MTIME_SLACK``) and nothing would be cached."""
    r = spark_runs("hdfs")
    r.reset()
    base = 1_700_000_000
    for top in (os.path.join(r.checkpoint, d) for d in ("offsets", "commits", "sources/0")):
        _age(top, base)
    _age(os.path.join(r.output, "_spark_metadata"), base)
    yield r
    r.reset()


def _age(log_dir: str, base: int) -> None:
    for name in os.listdir(log_dir):
        m = _LOG_NAME.match(name)
        if m:
            t = base + 10 * int(m.group(1))
            os.utime(os.path.join(log_dir, name), (t, t))


def _model(run):
    ckpt = Checkpoint.open(run.checkpoint, source_compact_interval=COMPACT_INTERVAL)
    return ckpt, [open_sink(run.output, compact_interval=COMPACT_INTERVAL)]


def _without_cache(run) -> tuple[list[dict], dict]:
    """What fsck and inspect say on their own (each its own model, no cache): the reference."""
    ckpt, sinks = _model(run)
    findings = [f.to_dict() for f in run_fsck(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))]
    ckpt, sinks = _model(run)
    return findings, inspect_checkpoint(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))


def _pass(run, **kw):
    ckpt, sinks = _model(run)
    p = run_check_pass(ckpt, sinks, sync=False, **kw)
    return p, [f.to_dict() for f in p.findings], p.report


def _cache_path(run) -> str:
    fm, root = open_file_manager(run.checkpoint)
    return os.path.join(ops_dir(fm, root), "verdicts.json")


def _old_sink_file(run) -> str:
    """A plain sink log file below the newest one (Spark no longer rewrites it)."""
    md = os.path.join(run.output, "_spark_metadata")
    plain = sorted((int(n) for n in os.listdir(md) if n.isdigit()))
    return os.path.join(md, str(plain[-3]))


def _damage(run) -> None:
    """Damage Spark's own files would show after a bad copy: an old source log file that is not JSON
    (its sidecar rewritten to match, so only the parse finds it), and a sink data file gone."""
    log = os.path.join(run.checkpoint, "sources", "0")
    plain = sorted(int(n) for n in os.listdir(log) if n.isdigit())
    victim = os.path.join(log, str(plain[-3]))
    st = os.stat(victim)
    body = b'v1\nnot json {"path":"x"}'
    open(victim, "wb").write(body)
    open(os.path.join(log, f".{plain[-3]}.crc"), "wb").write(hadoop_crc_bytes(body))
    os.utime(victim, (st.st_mtime, st.st_mtime))
    entries = open(_old_sink_file(run), "rb").read().decode().split("\n")[1:]
    path = json.loads(entries[0])["path"]
    os.remove(path[len("file:"):] if path.startswith("file:") else path)


def test_deleted_or_damaged_cache_changes_no_verdict(hdfs_run):
    run = hdfs_run
    ckpt, sinks = _model(run)
    sync_ledger(ckpt, sinks)  # the ledger first: the window can reach past Spark's files with it
    _damage(run)
    want_findings, want_report = _without_cache(run)
    codes = {f["code"] for f in want_findings}
    assert {"truncated-log-file", "sink-file-missing"} <= codes, codes  # the damage is there to be found
    before = tree_snapshot(run.checkpoint, run.output)

    cold, findings, report = _pass(run)
    assert cold.cache_hits == 0
    assert (findings, report) == (want_findings, want_report)
    assert os.path.exists(_cache_path(run)) and not _cache_path(run).startswith(run.checkpoint + os.sep)

    warm, findings, report = _pass(run)
    assert warm.cache_hits > 0 and warm.cache_ignored is None  # the cache answered, and changed nothing
    assert (findings, report) == (want_findings, want_report)

    os.remove(_cache_path(run))
    _, findings, report = _pass(run)
    assert (findings, report) == (want_findings, want_report)

    good = open(_cache_path(run), "rb").read()
    damaged = {
        "torn": good[: len(good) // 2],
        "not JSON": b"\x00\x01garbage",
        "another format": json.dumps({"format": 0, "sound": {}, "seals": {}}).encode(),
        "a newer format": json.dumps({**json.loads(good), "format": FORMAT + 1}).encode(),
        "wrong shape": json.dumps({**json.loads(good), "sound": {"x": 1}}).encode(),
        "another version's": json.dumps({**json.loads(good), "written_by": "0.0.1"}).encode(),
    }
    for what, blob in damaged.items():
        open(_cache_path(run), "wb").write(blob)
        p, findings, report = _pass(run)
        assert p.cache_ignored, what  # never trusted
        assert p.cache_hits == 0, what
        assert (findings, report) == (want_findings, want_report), what
    assert tree_snapshot(run.checkpoint, run.output) == before  # the pass wrote nothing of Spark's


def test_a_pass_without_the_batch_list_reads_only_what_is_new(hdfs_run):
    """``batches=False`` (a materialization's pass): the same findings, and inspect's report with no per-batch
    list but otherwise the same; a warm pass then reads no offsets or commits file but those Spark may
    still rewrite, where the full report reads every one. Damage in an old offsets file is still found,
    by fsck (which judges every file, cached or not)."""
    run = hdfs_run
    ckpt, sinks = _model(run)
    sync_ledger(ckpt, sinks)
    old = sorted(int(n) for n in os.listdir(os.path.join(run.checkpoint, "offsets")) if n.isdigit())[2]
    victim = os.path.join(run.checkpoint, "offsets", str(old))
    st = os.stat(victim)
    body = open(victim, "rb").read().replace(b'"batchWatermarkMs"', b'"batchWatermarkMs" oops', 1)
    open(victim, "wb").write(body)
    open(os.path.join(run.checkpoint, "offsets", f".{old}.crc"), "wb").write(hadoop_crc_bytes(body))
    os.utime(victim, (st.st_atime, st.st_mtime))
    want_findings, want_report = _without_cache(run)
    assert any(f["path"].endswith(f"/offsets/{old}") for f in want_findings), want_findings

    def reads(**kw):
        ckpt, sinks = _model(run)
        seen: list[str] = []
        read_many, read_bytes = ckpt.fm.read_many, ckpt.fm.read_bytes

        def spy_many(paths, *a, **k):
            seen.extend(paths)
            return read_many(paths, *a, **k)

        def spy_bytes(path, *a, **k):
            seen.append(path)
            return read_bytes(path, *a, **k)

        ckpt.fm.read_many, ckpt.fm.read_bytes = spy_many, spy_bytes
        p = run_check_pass(ckpt, sinks, sync=False, **kw)
        logs = {os.path.relpath(x, run.checkpoint) for x in seen
                if ("/offsets/" in x or "/commits/" in x) and os.path.basename(x).isdigit()}
        return p, [f.to_dict() for f in p.findings], p.report, logs

    for batches in (False, True, False):  # cold, warm (the full report), warm
        p, findings, report, logs = reads(batches=batches)
        assert findings == want_findings, batches
        assert report == (want_report if batches else {**want_report, "batches": None,
                                                       "damaged": [d for d in want_report["damaged"]
                                                                   if not d["path"].endswith(f"/offsets/{old}")]})
    everything = {f"{d}/{b}" for d in ("offsets", "commits") for b in os.listdir(os.path.join(run.checkpoint, d))
                  if b.isdigit()}
    last = max(int(x.split("/")[1]) for x in everything)
    # what the warm pass may read: the newest batches (Spark may still rewrite their files; the window
    # judges the newest), the damaged file (never cached) and the batches whose restart sets read it (the
    # window stops there), with the window's read-ahead below. Not the sound batches in between.
    between = {f"offsets/{b}" for b in range(old + 2, last - 2)} | {f"commits/{b}" for b in range(old + 2, last - 1)}
    assert len(between) >= 6 and between <= everything
    assert f"offsets/{old}" in logs and not logs & between, sorted(logs)
    _, _, _, full = reads(batches=True)
    assert full == everything




def test_sources_of_an_offsets_file_not_read_again_still_count(hdfs_run):
    """fsck compares the number of sources of every offsets file with the newest one's. A file taken from the
    cache is not read, so the cache keeps its count: when the newest file lists one source more, the warm
    pass names every older file, as fsck without a cache does."""
    run = hdfs_run
    _pass(run)
    warm, _, _ = _pass(run)
    assert warm.cache_hits > 0
    top = max(int(n) for n in os.listdir(os.path.join(run.checkpoint, "offsets")) if n.isdigit())
    newest = os.path.join(run.checkpoint, "offsets", str(top))
    lines = open(newest, "rb").read().split(b"\n")
    body = b"\n".join(lines + [lines[-1]])  # a second source, as a truncated write of another query's file
    open(newest, "wb").write(body)
    open(os.path.join(run.checkpoint, "offsets", f".{top}.crc"), "wb").write(hadoop_crc_bytes(body))
    want_findings, want_report = _without_cache(run)
    named = {f["path"].rsplit("/", 1)[-1] for f in want_findings if f["code"] == "source-count-mismatch"}
    assert len(named) >= 5, want_findings
    p, findings, report = _pass(run)
    assert p.cache_hits > 0
    assert (findings, report) == (want_findings, want_report)


def test_rewritten_files_are_judged_again(hdfs_run):
    run = hdfs_run
    _pass(run)
    warm, findings, _ = _pass(run)
    assert warm.cache_hits > 0 and findings == _without_cache(run)[0]

    # an old sink log file rewritten (same name, new content and mtime): the cached "sound" is not used
    old = _old_sink_file(run)
    data = open(old, "rb").read()
    open(old, "wb").write(data[: len(data) - 7])
    _, findings, report = _pass(run)
    want_findings, want_report = _without_cache(run)
    assert any(f["path"].endswith(old[len(run.output):]) for f in want_findings)
    assert (findings, report) == (want_findings, want_report)
    open(old, "wb").write(data)

    # an old source log file's .crc sidecar rewritten with the same size: judged again (the sidecar is
    # part of the key)
    _pass(run)
    log = os.path.join(run.checkpoint, "sources", "0")
    name = str(sorted(int(n) for n in os.listdir(log) if n.isdigit())[-3])
    crc = os.path.join(log, f".{name}.crc")
    body = open(os.path.join(log, name), "rb").read()
    open(crc, "wb").write(hadoop_crc_bytes(body[:-1] + b"X"))
    _, findings, _ = _pass(run)
    want_findings = _without_cache(run)[0]
    assert [f["code"] for f in want_findings] == ["stale-crc"]
    assert findings == want_findings
    open(crc, "wb").write(hadoop_crc_bytes(body))

    # the newest sink log file rewritten with its size and mtime kept: Spark may still rewrite it, so it
    # is always read again
    _pass(run)
    md = os.path.join(run.output, "_spark_metadata")
    newest = os.path.join(md, str(max(int(n.split(".")[0]) for n in os.listdir(md) if n[0].isdigit())))
    if not os.path.exists(newest):
        newest += ".compact"
    st = os.stat(newest)
    body = open(newest, "rb").read()
    garbage = b"v1\n" + b"{" * (len(body) - 3)
    open(newest, "wb").write(garbage)
    os.utime(newest, ns=(st.st_atime_ns, st.st_mtime_ns))
    p, findings, _ = _pass(run)
    want_findings = _without_cache(run)[0]
    assert any(f["path"].endswith(os.path.basename(newest)) for f in want_findings)
    assert findings == want_findings


def test_health_check_reuses_the_pass_only_while_nothing_changed(hdfs_run):
    run = hdfs_run
    _pass(run)
    ckpt, sinks = _model(run)
    assert [f.to_dict() for f in shared_fsck(ckpt, sinks)] == _without_cache(run)[0] == []
    # a sink data file deleted after the pass: the fingerprint differs, fsck runs, and finds it
    entries = open(_old_sink_file(run), "rb").read().decode().split("\n")[1:]
    path = json.loads(entries[0])["path"]
    os.remove(path[len("file:"):] if path.startswith("file:") else path)
    ckpt, sinks = _model(run)
    got = [f.to_dict() for f in shared_fsck(ckpt, sinks)]
    assert got == _without_cache(run)[0]
    assert "sink-file-missing" in {f["code"] for f in got}
    # the health check saved the cache after that: the next pass must not trust the sink-data verdicts
    # found before the file went (their seal no longer holds)
    _, findings, _ = _pass(run)
    assert findings == _without_cache(run)[0] == got


def test_findings_another_version_remembered_are_not_reused(hdfs_run):
    """After an upgrade, the health check judges afresh: the findings the last pass remembered are what
    the old version's checks found, and would hide what a check added since finds."""
    run = hdfs_run
    _damage(run)
    want = _without_cache(run)[0]
    assert "sink-file-missing" in {f["code"] for f in want}
    _pass(run)  # remembers the findings, with a fingerprint of what they judged; nothing changes after it
    doc = json.loads(open(_cache_path(run), "rb").read())
    assert doc["written_by"] == tool_build() and doc["written_by"].startswith(checkpoint_ops.__version__ + "+")
    # what an older version, one without the sink-data check, would have remembered for the same files
    doc["fsck"]["findings"] = [f for f in doc["fsck"]["findings"] if f["code"] != "sink-file-missing"]
    open(_cache_path(run), "w").write(json.dumps(doc))
    ckpt, sinks = _model(run)
    assert "sink-file-missing" not in {f.code for f in shared_fsck(ckpt, sinks, save=False)}  # reused as is
    open(_cache_path(run), "w").write(json.dumps({**doc, "written_by": "0.0.1"}))
    ckpt, sinks = _model(run)
    cache = VerdictCache.for_checkpoint(ckpt)
    assert "written by checkpoint-ops '0.0.1'" in cache.ignored and cache.findings_for("x") is None
    assert [f.to_dict() for f in shared_fsck(ckpt, sinks, cache=cache)] == want


def test_two_writers_at_once_leave_a_whole_cache(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    path = os.path.join(root, "verdicts.json")
    caches = [VerdictCache(fm, path, {f"window\tcheckpoint\toffsets/{i}-{k}": "1:2.0|-" for k in range(2000)})
              for i in range(2)]
    for c in caches:  # what each run confirmed becomes what it saves
        for key, stamp in list(c._old.items()):
            c.record_sound(*key.split("\t"), stamp)

    def write(c):
        for _ in range(20):
            c.save()

    threads = [threading.Thread(target=write, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = VerdictCache.load(fm, path)
    assert got.ignored is None
    assert got._old in ({k: v for k, v in c._new.items()} for c in caches)  # one writer's whole cache


# -- the window memo (window_memo.py): a batch taken from it must be exactly what judging it finds --------

def _warm(run):
    """Two passes: the first remembers the window's batches, the second takes them from the memo."""
    _pass(run)
    warm, findings, report = _pass(run)
    assert warm.window_hits > 0  # the memo answered for old batches
    assert (findings, report) == _without_cache(run)
    return report["rollback_window"]


def _window_batch_files(run, role: str) -> dict[int, list[str]]:
    """For each batch of the window now, the files of ``role`` its restart set reads (from Spark's files)."""
    from checkpoint_ops.restart import restart_set

    ckpt, sinks = _model(run)
    w = inspect_checkpoint(ckpt, sinks)["rollback_window"]
    return {t: [f.rel for f in restart_set(ckpt, t, sinks, deep=False).files if f.role == role]
            for t in range(w["earliest"], w["latest"] + 1)}


def _delete_state_delta(run) -> None:
    """State maintenance gone wrong: a delta an old batch's restart needs is deleted."""
    sets = _window_batch_files(run, "state")
    # the oldest batch whose load reads a delta (Spark's maintenance may have left a snapshot exactly at one)
    rel = next(r for t in sorted(sets) for r in sets[t] if r.endswith(".delta"))
    os.remove(os.path.join(run.checkpoint, rel))


def _cut_beside_a_stale_sidecar(path: str) -> None:
    """A bad copy: ``path`` cut short, its mtime kept, beside a checksum sidecar of the size the cut file's
    would have and other content. Only the sidecar's content shows it stale (a file's size depends on the
    paths in it: a sidecar left as it was would be caught by its size on some machines and not on others)."""
    side = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
    st, side_st = os.stat(path), os.stat(side)
    data = open(path, "rb").read()
    cut = len(data) // 2
    open(path, "wb").write(data[:cut])
    open(side, "wb").write(hadoop_crc_bytes(data[-cut:]))  # the right size, the wrong content
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.utime(side, ns=(side_st.st_atime_ns, side_st.st_mtime_ns))


def _truncate_sink_log_file(run) -> None:
    """A plain sink-log file of an old batch, badly copied (in a pass the window parses it before fsck)."""
    sets = _window_batch_files(run, "sink log")
    rels = sorted({r for t in sorted(sets)[:3] for r in sets[t] if not r.endswith(".compact")})
    _cut_beside_a_stale_sidecar(os.path.join(run.output, rels[0]))


def _truncate_offsets_file(run) -> None:
    """An offsets file of the window's oldest batch, badly copied (the window reads it before fsck too)."""
    sets = _window_batch_files(run, "offsets")
    _cut_beside_a_stale_sidecar(os.path.join(run.checkpoint, sorted(sets[min(sets)])[-1]))


def _purge_by_retention(run) -> None:
    """Spark's retention after a later run: the oldest offsets and commits files (and sidecars) go."""
    for d in ("offsets", "commits"):
        top = os.path.join(run.checkpoint, d)
        ids = sorted(int(n) for n in os.listdir(top) if n.isdigit())
        for b in ids[:3]:
            for name in (str(b), f".{b}.crc"):
                if os.path.exists(os.path.join(top, name)):
                    os.remove(os.path.join(top, name))


@pytest.mark.parametrize("damage", [_delete_state_delta, _truncate_sink_log_file, _truncate_offsets_file,
                                    _purge_by_retention],
                         ids=["state delta deleted", "sink-log file truncated", "offsets file truncated",
                              "purged by retention"])
def test_window_memo_sees_a_change_to_an_old_batch(hdfs_run, damage):
    run = hdfs_run
    window_before = _warm(run)
    damage(run)
    want_findings, want_report = _without_cache(run)
    assert want_report["rollback_window"] != window_before  # the change moves the window: it must be seen
    p, findings, report = _pass(run)
    assert (findings, report) == (want_findings, want_report)
    # and the pass after it (the memo now holds what this one confirmed) still agrees
    p, findings, report = _pass(run)
    assert (findings, report) == (want_findings, want_report)
    ckpt, sinks = _model(run)
    assert [f.to_dict() for f in shared_fsck(ckpt, sinks)] == want_findings


def test_window_memo_damaged_or_tampered_changes_no_verdict(hdfs_run):
    run = hdfs_run
    want = _without_cache(run)
    _warm(run)
    good = json.loads(open(_cache_path(run), "rb").read())
    assert good["window"]  # the memo is stored, one short entry per remembered batch
    tampered = {
        # a digest that no longer matches (as if the files had changed): judged again, not trusted
        "wrong digests": {**good, "window": {b: "0" * 16 for b in good["window"]}},
        # the source logs' offsets kept with a digest, changed: the digest computed with them differs
        "wrong log offsets": {**good, "window": {b: v.split("|")[0] + "|999" for b, v in good["window"].items()}},
        # the offsets of the digests' files as an entry of an earlier version had none: read to check
        "no log offsets": ({**good, "window": {b: v.split("|")[0] for b, v in good["window"].items()}}, True),
        # a recorded offsets file whose kept sources are not "version:count": judged again
        "damaged offsets facts": {**good, "sound": {k: (v.split("#")[0] + "#x" if k.startswith("offsets\t") else v)
                                                    for k, v in good["sound"].items()}},
        "wrong shape": {**good, "window": {"x": 1}},
        "not a map": {**good, "window": [1, 2]},
    }
    assert all("|" in v for v in good["window"].values())  # each entry keeps its source logs' offsets
    assert any(k.startswith("offsets\t") and "#1:" in v for k, v in good["sound"].items())
    for what, doc in tampered.items():
        doc, answered = doc if isinstance(doc, tuple) else (doc, what == "damaged offsets facts")
        open(_cache_path(run), "wb").write(json.dumps(doc).encode())
        p, findings, report = _pass(run)
        assert (p.window_hits > 0) == answered, what
        assert (findings, report) == want, what


def test_window_memo_hashes_each_id_by_every_name_it_can_have(tmp_path):
    """The memo hashes a log directory per batch id from the names a file of that id can have (``7``,
    ``7.compact``, with a leading dot and ``.crc``), so a pass reads the stamps of the batches it asks
    about only; each id's hash is the one grouping every name by the pattern gives. A name with a leading
    zero (``007``, which Spark's ``isBatchFile`` takes as batch 7) is still part of id 7's hash."""
    from checkpoint_ops.model.listing import Listing
    from checkpoint_ops.window_memo import _IdHashes

    top = tmp_path / "log"
    top.mkdir()
    for name in ("0", ".0.crc", "6", ".6.crc", "7", ".7.crc", "8.compact", ".8.compact.crc", "9", "notes.txt"):
        (top / name).write_bytes(b"v1\n" + name.encode())
    fm, root = open_file_manager(str(tmp_path))

    def hashes():
        return _IdHashes(Listing.scan(fm, root), "log")

    lazy = hashes()
    assert lazy._all is None  # no leading-zero name: nothing is grouped up front
    eager = lazy._group_all()
    assert {b: lazy.one(b) for b in range(12)} == {b: eager.get(b, 0) for b in range(12)}
    assert lazy.range(5, 9) == eager[6] ^ eager[7] ^ eager[8] ^ eager[9]
    before = lazy.one(7)
    (top / "007").write_bytes(b"planted")
    planted = hashes()
    assert planted._all is not None and planted.one(7) != before
    assert {b: planted.one(b) for b in (0, 6, 8, 9)} == {b: lazy.one(b) for b in (0, 6, 8, 9)}


def test_window_memo_ranges_moved_by_their_edges_are_the_ranges_summed_afresh(tmp_path):
    """``_IdHashes.range`` keeps the last range's XOR and moves it by its edges when the next range overlaps it
    (the window asks for ranges that slide by one batch): every answer, in any order of ranges, is the XOR of its
    ids' hashes taken one by one."""
    import random

    from checkpoint_ops.model.listing import Listing
    from checkpoint_ops.window_memo import _IdHashes

    top = tmp_path / "log"
    top.mkdir()
    rnd = random.Random(15)
    for b in range(120):
        if rnd.random() < 0.85:  # gaps: ids with no file hash to 0
            name = f"{b}.compact" if b % 10 == 9 else str(b)
            (top / name).write_bytes(b"v1\n" + os.urandom(rnd.randint(1, 20)))
    fm, root = open_file_manager(str(tmp_path))
    ids, reference = (_IdHashes(Listing.scan(fm, root), "log") for _ in range(2))
    calls = []
    one = ids.one
    ids.one = lambda b: calls.append(b) or one(b)  # what range() hashes

    def afresh(first: int, last: int) -> int:
        acc = 0
        for b in range(max(first, 0), last + 1):
            acc ^= reference.one(b)
        return acc

    slide = [(b - 11, b) for b in range(130, -15, -1)]  # the window's slide, newest down
    for first, last in slide:
        assert ids.range(first, last) == afresh(first, last), (first, last)
    assert len(calls) < 3 * len(slide), f"{len(calls)} ids hashed for {len(slide)} ranges of 12: not moved by edges"
    asked = [(b - 11, b) for b in range(-15, 130)]  # up again
    for _ in range(3000):  # and anywhere: jumps, shrinking and growing, empty and below 0
        first = rnd.randint(-20, 135)
        asked.append((first, first + rnd.randint(-3, 25)))
    for first, last in asked:
        assert ids.range(first, last) == afresh(first, last), (first, last, ids._last_range)


def test_a_sinks_data_seal_is_of_its_own_listing_however_often_it_is_asked(tmp_path):
    """``DataSeal.of`` finds a listing's data files once (a pass seals and checks the seal more than once): every
    seal is the one its definition gives (names of the files outside the log and the pairing record, sorted, up to
    the horizon), and a later listing of the same output, a file gone, is sealed by what it holds."""
    import hashlib

    from checkpoint_ops.model.listing import Listing
    from checkpoint_ops.pairing import PAIRING_FILE
    from checkpoint_ops.verdicts import DataSeal

    out = tmp_path / "out"
    (out / "_spark_metadata").mkdir(parents=True)
    (out / "_spark_metadata" / "0").write_text("v1\n")
    (out / PAIRING_FILE).write_text("{}")
    for i, name in enumerate(["part-b.parquet", "part-a.parquet", "k=1/part-c.parquet", ".part-a.parquet.crc"]):
        path = out / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
        os.utime(path, (1000 + i, 1000 + i))
    fm, root = open_file_manager(str(out))

    def defined(names: list[str], horizon: float) -> DataSeal:
        return DataSeal(horizon, len(names), hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest())

    first = Listing.scan(fm, root)
    everything = [".part-a.parquet.crc", "k=1/part-c.parquet", "part-a.parquet", "part-b.parquet"]
    for _ in range(2):
        assert DataSeal.of(first) == defined(everything, 1003.0)
        assert DataSeal.of(first, 1001.0) == defined(["part-a.parquet", "part-b.parquet"], 1001.0)
        assert DataSeal.of(first, 999.0) == defined([], 999.0)
        assert DataSeal.of(first).holds(first)
    (out / "part-b.parquet").unlink()
    second = Listing.scan(fm, root)
    assert DataSeal.of(second) == defined([n for n in everything if n != "part-b.parquet"], 1003.0)
    assert not DataSeal.of(first).holds(second) and DataSeal.of(first) == defined(everything, 1003.0)
    # files dated before 1970: the horizon is never below 0, so one restored there later breaks the seal
    old = tmp_path / "old"
    old.mkdir()
    for name, mtime in (("part-a", -5), ("part-b", -3)):
        (old / name).write_bytes(b"x")
        os.utime(old / name, (mtime, mtime))
    fm, root = open_file_manager(str(old))
    seal = DataSeal.of(Listing.scan(fm, root))
    assert seal == defined(["part-a", "part-b"], 0.0)
    (old / "part-c").write_bytes(b"x")
    os.utime(old / "part-c", (-1, -1))
    assert not seal.holds(Listing.scan(fm, root))
