"""The batch ledger's segments: applied in name order (a sync written right after a rollback's truncation
comes after it, even within the same second); streamed, indexed and merged to exactly the records the format
defines; merged like a binary counter (a few rewrites a record, no sidecar left behind); and read through
their stored indexes, which are an optimisation only (damaged, stale or forged ones are ignored, a segment
changed under a valid one is refused, naming it)."""

from __future__ import annotations

import json
import os

import pytest

from checkpoint_ops.errors import BadInputError
from checkpoint_ops.ledger import Ledger
from checkpoint_ops.storage import open_file_manager


def test_a_sync_right_after_a_truncation_survives_it(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    ledger = Ledger(fm, f"{root}/ledger")
    ledger._write_segment("sync", b'{"batch":5,"offsets":"old timeline"}\n')
    ledger.truncate(3, "op1")
    ledger._write_segment("sync", b'{"batch":4,"offsets":"new timeline"}\n')
    again = Ledger(fm, f"{root}/ledger")
    assert {b: r["offsets"] for b, r in again.records.items()} == {4: "new timeline"}


def _naive(fm, path: str) -> dict[int, dict]:
    """The ledger as the format defines it: every segment in name order, lines merged per batch, records
    above a truncation's batch dropped (what ``Ledger`` held in memory before it streamed)."""
    from checkpoint_ops.ledger import _merge

    records: dict[int, dict] = {}
    for f in sorted((f for f in fm.list(path) if not f.is_dir and not f.name.startswith(".")), key=lambda f: f.name):
        blob = fm.read_bytes(f.path)
        if "-truncate-" in f.name:
            after = json.loads(blob)["after_batch"]
            records = {b: r for b, r in records.items() if b <= after}
            continue
        for line in blob.decode().splitlines():
            if line.strip():
                rec = json.loads(line)
                _merge(records.setdefault(rec["batch"], {"batch": rec["batch"]}), rec)
    return records


def _ledger_with_history(tmp_path, syncs: int = 14, merge_run: int | None = 3):
    """``syncs`` sync segments with records split over them (offsets first, the commit and sink entries in
    the next one), a truncation after the sixth, and after each sync a merge of runs longer than
    ``merge_run`` (None: none): (fm, path, records as the format defines them)."""
    fm, root = open_file_manager(str(tmp_path))
    path = f"{root}/ledger"
    ledger = Ledger(fm, path)
    sink = "file:///out"
    for k in range(syncs):
        lines = [{"batch": 10 * k + i, "offsets": f"o{k}-{i}", "timestamp_ms": k} for i in range(10)]
        lines += [{"batch": 10 * k - 1, "commits": f"c{k}", "sinks": {sink: {"entries": [f'{{"path":"{k}"}}']}}}]
        ledger._write_segment("sync", "\n".join(json.dumps(r) for r in sorted(lines, key=lambda r: r["batch"]))
                              .encode())
        if k == 5:
            ledger.truncate(45, "op1")
        if merge_run is not None:
            ledger.compact_segments(max_run=merge_run)
    return fm, path, _naive(fm, path)


def test_streamed_index_and_merge_give_the_records_the_format_defines(tmp_path):
    """Records split over segments (offsets first, the commit and sink entries later), truncations, and
    more syncs than a run keeps: the index reads back exactly the merged records, kinds included, and the
    streaming merge of a run changes none of them."""
    fm, path, want = _ledger_with_history(tmp_path, syncs=12, merge_run=None)
    got = Ledger(fm, path)
    assert dict(got.records.items()) == want
    assert got.batches("commits") == sorted(b for b, r in want.items() if r.get("commits") is not None)
    assert got.batches("offsets") == sorted(b for b, r in want.items() if r.get("offsets") is not None)
    assert all(got.has("sinks", b) == ("sinks" in r) for b, r in want.items())
    merged = got.compact_segments(max_run=2)
    assert merged
    assert _naive(fm, path) == want
    assert dict(Ledger(fm, path).records.items()) == want


def test_a_loaded_ledger_indexes_the_segment_it_writes_as_a_fresh_load_would(tmp_path):
    """A ledger already read (a pass: the sync's index serves the pass that follows) indexes the sync
    segment it writes from the bytes it wrote: its records, kinds and recently read records then equal
    those of a ledger loaded from disk, including lines that add to a batch read before."""
    fm, root = open_file_manager(str(tmp_path))
    path = f"{root}/ledger"
    sink = "file:///out"
    ledger = Ledger(fm, path)
    ledger._write_segment("sync", b'{"batch":0,"offsets":"o0"}\n{"batch":1,"offsets":"o1"}\n')
    assert ledger.records[1] == {"batch": 1, "offsets": "o1"}  # loaded, and batch 1 read (kept as recent)
    bodies = [b'{"batch":1,"commits":"c1"}\n\n{"batch":2,"offsets":"o2"}',
              json.dumps({"batch": 2, "commits": "c2", "sinks": {sink: {"entries": ["{}"]}}}).encode() + b"\n"]
    for body in bodies:
        ledger._write_segment("sync", body)
        assert ledger._records is not None  # indexed in place, not dropped for a full load
    fresh = Ledger(fm, path)
    assert dict(ledger.records.items()) == dict(fresh.records.items()) == _naive(fm, path)
    assert ledger.records[1] == {"batch": 1, "offsets": "o1", "commits": "c1"}
    assert [ledger.records.kinds(b) for b in range(3)] == [fresh.records.kinds(b) for b in range(3)]
    assert ledger.batches("commits") == [1, 2] and ledger.has("sinks", 2)


def test_compaction_rewrites_each_record_a_few_times_not_the_whole_ledger_each_run(tmp_path):
    """300 syncs, each followed by the compaction ``sync`` runs: the run never holds more than
    ``max_run`` segments, the records are exactly what the format defines, and the bytes the merges write
    stay within a few times the ledger's size (about log2 of the syncs), where merging the whole run each
    time wrote the ledger again every ``max_run`` syncs (about 19 times its size here). No checksum
    sidecar of a merged-away segment stays behind."""
    fm, root = open_file_manager(str(tmp_path))
    path = f"{root}/ledger"
    ledger = Ledger(fm, path)
    written = 0
    for k in range(300):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}" + "x" * 40}).encode() + b"\n")
        for name in ledger.compact_segments(max_run=8):
            written += fm.info(f"{path}/{name}").size
        assert len(ledger.segments) <= 8
    data = sum(f.size for f in fm.list(path) if not f.is_dir and not f.name.startswith("."))
    assert written <= 10 * data, (written, data)
    want = _naive(fm, path)
    assert sorted(want) == list(range(300))
    assert dict(Ledger(fm, path).records.items()) == want
    names = {f.name for f in fm.list(path) if not f.is_dir}
    assert all(n[1:-4] in names for n in names if n.startswith(".") and n.endswith(".crc")), sorted(names)
    assert any(n.startswith(".") and n.endswith(".crc") for n in names)  # sidecars are kept where Hadoop's are


def test_compaction_removes_sidecars_an_earlier_release_left_behind(tmp_path):
    """Releases before this one deleted merged segments without their ``.crc`` sidecars: the next
    compaction removes those (and only those)."""
    fm, root = open_file_manager(str(tmp_path))
    path = f"{root}/ledger"
    ledger = Ledger(fm, path)
    stray = f"{path}/.20260101T000000.000000Z-sync-0badc0de.jsonl.crc"
    for k in range(3):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}"}).encode() + b"\n")
    with open(stray, "wb") as f:  # as Hadoop writes it: no sidecar of its own
        f.write(b"crc\x00\x00\x00\x02\x00")
    ledger.compact_segments(max_run=8)
    assert fm.exists(stray), "no run was merged: nothing is listed or deleted"
    for k in range(3, 9):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}"}).encode() + b"\n")
    assert ledger.compact_segments(max_run=8)
    assert not fm.exists(stray)
    names = {f.name for f in fm.list(path) if not f.is_dir}
    crcs = [n for n in names if n.startswith(".") and n.endswith(".crc")]
    assert crcs and all(n[1:-4] in names for n in crcs), sorted(names)
    assert dict(Ledger(fm, path).records.items()) == _naive(fm, path) and len(_naive(fm, path)) == 9




def _index_files(fm, path) -> dict[str, str]:
    return {f.name[:-4]: f.path for f in fm.list(f"{path}/.index") if f.name.endswith(".idx")}


def test_segment_indexes_are_used_and_give_what_reading_the_segments_gives(tmp_path):
    """Every sync and merged segment has its index; a load uses them (a segment damaged in place, same size,
    is not read by the load), gives exactly the records of reading every segment, and a record that is not
    where its index says is refused, naming the segment."""
    fm, path, want = _ledger_with_history(tmp_path)
    segments = [f.name for f in fm.list(path) if not f.is_dir and not f.name.startswith(".")]
    indexed = _index_files(fm, path)
    assert set(indexed) == {n for n in segments if "-truncate-" not in n}
    got = Ledger(fm, path)
    assert dict(got.records.items()) == want
    assert [got.records.kinds(b) for b in sorted(want)] == [_kinds_of(want[b]) for b in sorted(want)]
    # the same records when every index is gone (read from the segments)
    for p in indexed.values():
        fm.delete(p)
    assert dict(Ledger(fm, path).records.items()) == want
    assert not _index_files(fm, path), "a reader (no sync) writes no index"
    writer = Ledger(fm, path)
    writer.writes_index = True
    assert dict(writer.records.items()) == want
    assert set(_index_files(fm, path)) == set(indexed), "a sync's load keeps the index of what it read"
    # a segment overwritten in place with the same size: a new mtime, so its index no longer names it, and
    # the load reads the segment and refuses it, as without an index
    seg = max(n for n in indexed if "-merged-" in n)
    seg_path = f"{path}/{seg}"
    blob, before = fm.read_bytes(seg_path), os.stat(seg_path)
    with open(seg_path, "wb") as f:
        f.write(b"x" * len(blob))
    os.utime(seg_path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    with pytest.raises(BadInputError) as e:
        Ledger(fm, path).records
    assert seg in e.value.render() and "not what this tool writes" in e.value.render()
    # the same damage with the old mtime put back (what no editor does): the load trusts the index, the
    # read of a record there refuses, and so does a merge that would read the segment
    os.utime(seg_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    damaged = Ledger(fm, path)
    batch = json.loads(blob.splitlines()[0])["batch"]
    with pytest.raises(BadInputError) as e:
        damaged.records[batch]
    assert seg in e.value.render() and ".idx" in e.value.render()
    # a merge reads its segments whole: the damage is refused there too, naming the segment
    fm2, root2 = open_file_manager(str(tmp_path / "second"))
    small = Ledger(fm2, f"{root2}/ledger")
    for k in range(3):
        small._write_segment("sync", json.dumps({"batch": k, "offsets": "o"}).encode() + b"\n")
    newest = f"{root2}/ledger/{small.segments[-1]}"
    before = os.stat(newest)
    with open(newest, "r+b") as f:
        f.write(b"x")
    os.utime(newest, ns=(before.st_atime_ns, before.st_mtime_ns))
    small._write_segment("sync", json.dumps({"batch": 3, "offsets": "o"}).encode() + b"\n")
    with pytest.raises(BadInputError) as e:
        small.compact_segments(max_run=3)
    assert small.segments[-2] in e.value.render() and "cannot be merged" in e.value.render()


def _kinds_of(rec: dict) -> int:
    return sum(bit for k, bit in (("offsets", 1), ("commits", 2), ("sinks", 4)) if rec.get(k) is not None)


def _forged(head: bytes, payload: bytes, field: int, value: int) -> bytes:
    """The index with its first entry's ``field`` (0 batch, 1 offset, 2 kinds) set to ``value``, and a digest
    that matches (what only a deliberate edit makes)."""
    import hashlib
    import struct

    payload = payload[:8 * field] + struct.pack("<q", value) + payload[8 * field + 8:]
    header = {**json.loads(head), "sha256": hashlib.sha256(payload).hexdigest()}
    return json.dumps(header).encode() + b"\n" + payload


@pytest.mark.parametrize("damage", ["torn", "other_size", "other_mtime", "payload", "not_json", "empty",
                                    "kinds_out_of_range", "offset_past_the_end"])
def test_a_damaged_or_stale_index_is_ignored(tmp_path, damage):
    """An index that is torn, names another size or mtime of its segment, fails its digest, is not one at
    all, or (digest recomputed) holds an entry no line of its segment can have, changes no record: the
    segment is read instead (and a sync's load writes a good index again)."""
    fm, path, want = _ledger_with_history(tmp_path)
    indexed = _index_files(fm, path)
    target = indexed[max(indexed)]
    data = fm.read_bytes(target)
    head, _, payload = data.partition(b"\n")
    bad = {"torn": data[: len(data) - 5],
           "other_size": json.dumps({**json.loads(head), "size": json.loads(head)["size"] + 1}).encode() + b"\n" + payload,
           "payload": head + b"\n" + bytes([payload[0] ^ 1]) + payload[1:],  # the first entry's batch
           "other_mtime": json.dumps({**json.loads(head), "mtime": json.loads(head)["mtime"] - 1}).encode() + b"\n"
           + payload,
           "not_json": b"{\n" + payload,
           "empty": b"",
           "kinds_out_of_range": _forged(head, payload, 2, 8),
           "offset_past_the_end": _forged(head, payload, 1, 10**9)}[damage]
    with open(target, "wb") as f:
        f.write(bad)
    assert dict(Ledger(fm, path).records.items()) == want
    writer = Ledger(fm, path)
    writer.writes_index = True
    assert dict(writer.records.items()) == want
    assert fm.read_bytes(target) == data, "the sync's load wrote the index again"


def test_indexes_go_with_their_segments(tmp_path):
    """A merge deletes the indexes of the segments it merged (and their sidecars), and the next merge
    removes an index whose segment is gone (a crash between deleting a segment and its index)."""
    fm, path, want = _ledger_with_history(tmp_path)
    segments = {f.name for f in fm.list(path) if not f.is_dir and not f.name.startswith(".")}
    names = {f.name for f in fm.list(f"{path}/.index")}
    assert {n[:-4] for n in names if n.endswith(".idx")} <= segments
    assert all(n[1:-4] in names for n in names if n.startswith(".") and n.endswith(".crc"))
    stray = f"{path}/.index/20260101T000000.000000Z-sync-0badc0de.jsonl.idx"
    with open(stray, "wb") as f:
        f.write(b"{}\n")
    ledger = Ledger(fm, path)
    for k in range(4):
        ledger._write_segment("sync", json.dumps({"batch": 1000 + k, "offsets": "o"}).encode() + b"\n")
    assert ledger.compact_segments(max_run=3)
    assert not fm.exists(stray)
    segments = {f.name for f in fm.list(path) if not f.is_dir and not f.name.startswith(".")}
    assert set(_index_files(fm, path)) == {n for n in segments if "-truncate-" not in n}


def test_a_ledger_that_cannot_hold_indexes_still_works(tmp_path):
    """An index is an optimisation only: where it cannot be written (here a file stands where ``.index/``
    goes), syncs and merges still write their segments, and loads read them whole."""
    fm, root = open_file_manager(str(tmp_path))
    path = f"{root}/ledger"
    fm.write_bytes(f"{path}/.index", b"not a directory", overwrite=False)
    ledger = Ledger(fm, path)
    ledger.writes_index = True
    for k in range(10):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}"}).encode() + b"\n")
    assert ledger.compact_segments(max_run=8)
    assert fm.read_bytes(f"{path}/.index") == b"not a directory"
    assert dict(ledger.records.items()) == dict(Ledger(fm, path).records.items()) == _naive(fm, path)
    assert sorted(_naive(fm, path)) == list(range(10))


def test_on_the_s3_server_loads_use_the_indexes_written_with_the_segments(bucket):
    """On an object store the index names its segment by the LastModified a HEAD gives after the write;
    the listing a load takes gives the same, so the indexes of sync and merged segments are used there."""
    fm, root = open_file_manager(f"s3://{bucket}/indexed")
    path = f"{root}/ledger"
    ledger = Ledger(fm, path)
    for k in range(4):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}"}).encode() + b"\n")
    assert ledger.compact_segments(max_run=2)
    ledger._write_segment("sync", json.dumps({"batch": 4, "offsets": "o4"}).encode() + b"\n")
    fresh = Ledger(fm, path)
    names = fresh._segment_names()
    stamps = {f.path.rsplit("/", 1)[-1]: (f.size, f.mtime) for f in fm.walk(path) if f.path.rsplit("/", 1)[-1] in names}
    assert len(names) >= 2 and set(fresh._stored_indexes(names, stamps)) == set(names)
    assert dict(fresh.records.items()) == _naive(fm, path) and sorted(_naive(fm, path)) == [0, 1, 2, 3, 4]


_COMPACT = """
import sys
from checkpoint_ops.ledger import Ledger
from checkpoint_ops.storage import open_file_manager
fm, root = open_file_manager(sys.argv[1])
Ledger(fm, root + "/ledger").compact_segments(max_run=8)
"""


def test_a_merge_killed_at_any_point_is_finished_by_the_next_compaction(tmp_path):
    """A merge killed (SIGKILL) at each of its mutating calls in turn, after the merged segment is written and
    before all its inputs are deleted among them: nothing is lost, and the syncs that follow keep the run
    within ``max_run`` segments, leave no input of the killed merge behind and rewrite only a few times the
    ledger's size. (Left behind, those inputs kept the run too long, so every later sync merged again.)"""
    import shutil
    import subprocess
    import sys

    template = tmp_path / "template"
    fm, root = open_file_manager(str(template))
    ledger = Ledger(fm, f"{root}/ledger")
    for k in range(9):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}" + "x" * 40}).encode() + b"\n")
    inputs = set(ledger._segment_names())
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    killed_after_merged = 0
    for kill_at in range(1, 100):
        work = tmp_path / f"k{kill_at}"
        shutil.copytree(template, work)
        fm, root = open_file_manager(str(work))
        path = f"{root}/ledger"
        env = {**os.environ, "CHECKPOINT_OPS_KILL_AT": str(kill_at), "PYTHONPATH": repo}
        code = subprocess.run([sys.executable, "-c", _COMPACT, str(work)], env=env, cwd=repo).returncode
        names = {f.name for f in fm.list(path) if not f.is_dir and not f.name.startswith(".")}
        if code != 0 and any("-merged-" in n for n in names) and names & inputs:
            killed_after_merged += 1
        assert sorted(_naive(fm, path)) == list(range(9)), kill_at
        ledger = Ledger(fm, path)
        written = 0
        for k in range(9, 40):
            ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}" + "x" * 40}).encode() + b"\n")
            for name in ledger.compact_segments(max_run=8):
                written += fm.info(f"{path}/{name}").size
            assert len(ledger.segments) <= 8, (kill_at, k, ledger.segments)
        names = {f.name for f in fm.list(path) if not f.is_dir and not f.name.startswith(".")}
        assert not names & inputs, (kill_at, sorted(names & inputs))
        assert not fm.list(f"{path}/.merging"), (kill_at, fm.list(f"{path}/.merging"))
        data = sum(f.size for f in fm.list(path) if not f.is_dir and not f.name.startswith("."))
        assert written <= 8 * data, (kill_at, written, data)
        assert sorted(_naive(fm, path)) == list(range(40)) and dict(Ledger(fm, path).records.items()) == _naive(fm, path)
        if code == 0:
            break
    else:
        raise AssertionError("the merge never finished")
    assert killed_after_merged >= 3, "no kill landed between the merged segment and the inputs' deletion"


def test_on_the_s3_server_a_merge_stopped_before_deleting_its_inputs_is_finished(bucket):
    """The same on an object store, where ``.merging/`` shows in a listing only while it holds an intent: a
    merge killed after writing its merged segment leaves its inputs, and the next compaction deletes them."""
    import subprocess
    import sys

    fm, root = open_file_manager(f"s3://{bucket}/merging")
    path = f"{root}/ledger"
    ledger = Ledger(fm, path)
    for k in range(9):
        ledger._write_segment("sync", json.dumps({"batch": k, "offsets": f"o{k}"}).encode() + b"\n")
    inputs = set(ledger._segment_names())
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the merge's mutating calls: the intent, the merged segment, its index, then the deletes
    env = {**os.environ, "CHECKPOINT_OPS_KILL_AT": "4", "PYTHONPATH": repo}
    assert subprocess.run([sys.executable, "-c", _COMPACT, f"s3://{bucket}/merging"], env=env, cwd=repo).returncode != 0
    names = set(Ledger(fm, path)._segment_names())
    assert any("-merged-" in n for n in names) and len(names & inputs) == 9, sorted(names)
    assert [f.name for f in fm.list(path) if f.is_dir and f.name == ".merging"]
    ledger = Ledger(fm, path)
    ledger._write_segment("sync", json.dumps({"batch": 9, "offsets": "o9"}).encode() + b"\n")
    ledger.compact_segments(max_run=8)
    names = set(Ledger(fm, path)._segment_names())
    assert not names & inputs and len(names) <= 2, sorted(names)
    assert not fm.list(f"{path}/.merging")
    assert sorted(_naive(fm, path)) == list(range(10)) == sorted(Ledger(fm, path).records)
