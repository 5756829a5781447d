"""The bad-input corpus: real Spark checkpoints of the three state stores, damaged one way each, and
every command that reads them.

Each case is a row of data: the flavour, how to damage it, where the damage sits relative to a
rollback to batch n (see below), and which read-only commands read the damaged file. From that row
the expected outcome of every command follows by the rules in ``expected()``:

* ``restart``: the damage is in the restart set of n (what Spark reads to restart after n): rollback
  (dry run and apply) exits 2 naming the file, and changes nothing;
* ``removed``: the damage is in what the rollback removes anyway: a repair. The plan names it, the
  rollback applies, the result passes ``fsck --deep`` and Spark resumes from it with exact output;
* ``elsewhere``: neither: the rollback proceeds (it does not need the file);
* ``refused``: the ``--sink`` is not the checkpoint's (another query's output): rollback, ``fsck`` and
  ``ledger sync`` refuse (exit 1) naming it, and change nothing.

Always: no traceback, and the checkpoint and sink trees are unchanged by every command except an
applied rollback (and ``ledger sync``, which may add the pairing record beside the sink log, naming this
checkpoint). ``fsck --deep`` names every damage (exit 1); ``undo``, ``history`` and ``prune`` have nothing
to act on and say so without touching anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from typing import Callable

import pytest

from checkpoint_ops.pairing import PAIRING_FILE
from tests.helpers import cli
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, log_offset_at, target_before_last_compaction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- helpers that find Spark's files --------------------------------------------------------------------


def ck(run, rel: str) -> str:
    return os.path.join(run.checkpoint, rel)


def names(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if not n.startswith("."))


def write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def halve(path: str) -> None:
    data = open(path, "rb").read()
    write(path, data[: len(data) // 2])


def remove_with_sidecars(path: str) -> None:
    d, n = os.path.split(path)
    for name in (n, f".{n}.crc", f"{n}.crc", f".{n}.crc.crc"):
        if os.path.lexists(os.path.join(d, name)):
            os.remove(os.path.join(d, name))


def set_version(path: str, version: bytes) -> None:
    data = open(path, "rb").read()
    write(path, version + data[data.index(b"\n"):])


def store_dir(run, part: int) -> str:
    return ck(run, f"state/0/{part}")


def version_of(name: str) -> int:
    return int(name.split(".")[0].split("_")[0])


def commit_uid(run, b: int, part: int) -> str:
    doc = json.loads(open(ck(run, f"commits/{b}")).read().split("\n")[1])
    return doc["stateUniqueIds"]["0"][part][0]


def base_zip(run, v: int, part: int) -> str:
    """The zip the load of version v starts from (V1: the newest zip at or below v)."""
    zips = [n for n in names(store_dir(run, part)) if n.endswith(".zip") and version_of(n) <= v]
    return os.path.join(store_dir(run, part), max(zips, key=version_of))


def zip_ssts(path: str) -> list[str]:
    with zipfile.ZipFile(path) as z:
        md = json.loads(z.read("metadata").decode().split("\n", 1)[1])
    return [os.path.join(os.path.dirname(path), "SSTs", s["dfsSstFileName"]) for s in md["sstFiles"]]


def chain_sst(run, v: int) -> str:
    """An SST the zip that version v loads from names (in the first partition whose zip has any)."""
    for part in (0, 1):
        ssts = zip_ssts(base_zip(run, v, part))
        if ssts:
            return ssts[0]
    raise AssertionError("no zip at or below the version names an SST")


def source_file(run, k: int) -> str:
    d = ck(run, "sources/0")
    return f"sources/0/{k}" if os.path.exists(os.path.join(d, str(k))) else f"sources/0/{k}.compact"


def sink_log(run, b: int) -> str:
    d = os.path.join(run.output, "_spark_metadata")
    return f"_spark_metadata/{b}" if os.path.exists(os.path.join(d, str(b))) else f"_spark_metadata/{b}.compact"


def sink_entries(run, rel: str) -> list[dict]:
    lines = open(os.path.join(run.output, rel)).read().split("\n")[1:]
    return [json.loads(x) for x in lines if x]


# ---- the cases ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    flavour: str
    damage: Callable  # (run, n) -> the names a message may use for the damaged file
    where: str  # restart | removed | elsewhere | refused
    reads: set = field(default_factory=set)  # read-only commands that read it: inspect, offsets, ledger
    unprivileged: bool = False  # run the commands without root's permission override (permission cases)
    sink_from: str | None = None  # pass the output of this flavour's query as --sink instead of the run's own
    target: Callable | None = None  # (run) -> the rollback target; default target_before_last_compaction
    # the damage is ``commits/N`` or ``offsets/N-1`` (damaged, or a gap) of the batch `offsets --batch N` asks for: it
    # shows the batch's offsets (its offsets file is whole) with the file named beside them, exit 1; other damage it
    # reads is exit 2
    offsets_shown: bool = False

    def __str__(self):
        return self.name


def torn_offsets_n(run, n):
    write(ck(run, f"offsets/{n}"), b"")
    return (f"offsets/{n}",)


def truncated_offsets_prev(run, n):
    halve(ck(run, f"offsets/{n - 1}"))
    return (f"offsets/{n - 1}",)


def truncated_offsets_n(run, n):
    halve(ck(run, f"offsets/{n}"))
    return (f"offsets/{n}",)


def binary_commit_n(run, n):
    write(ck(run, f"commits/{n}"), bytes(range(256)) * 4)
    return (f"commits/{n}",)


def bare_commit_n(run, n):
    """Cut to its version line: Spark reads the missing metadata as {} (the batch's own watermark, not the one it
    committed; no state ids)."""
    write(ck(run, f"commits/{n}"), b"v1\n")
    return (f"commits/{n}",)


def v99_commit_n(run, n):
    set_version(ck(run, f"commits/{n}"), b"v99")
    return (f"commits/{n}",)


def v99_offsets_n(run, n):
    set_version(ck(run, f"offsets/{n}"), b"v99")
    return (f"offsets/{n}",)


def json_garbage_offsets_prev(run, n):
    lines = open(ck(run, f"offsets/{n - 1}"), "rb").read().split(b"\n")
    write(ck(run, f"offsets/{n - 1}"), b"\n".join([lines[0], b'{"batchWatermarkMs":0,,"conf":}', *lines[2:]]))
    return (f"offsets/{n - 1}",)


def missing_metadata(run, n):
    remove_with_sidecars(ck(run, "metadata"))
    return ("metadata",)


def garbage_metadata(run, n):
    write(ck(run, "metadata"), b"\x89PNG\r\n\x1a\n not a query id")
    return ("metadata",)


def empty_metadata(run, n):
    write(ck(run, "metadata"), b"")
    return ("metadata",)


def offsets_gap_prev(run, n):
    remove_with_sidecars(ck(run, f"offsets/{n - 1}"))
    return (f"offsets/{n - 1}",)


def commits_missing_n(run, n):
    remove_with_sidecars(ck(run, f"commits/{n}"))
    return (f"commits/{n}",)


def torn_source_entry(run, n):
    rel = source_file(run, log_offset_at(run, n))
    write(ck(run, rel), b"")
    return (rel,)


def truncated_source_compact(run, n):
    k = log_offset_at(run, n)
    c = (k + 1) // 5 * 5 - 1
    rel = f"sources/0/{c}.compact"
    halve(ck(run, rel))
    return (rel,)


def v99_source_plain(run, n):
    rel = source_file(run, log_offset_at(run, n))
    set_version(ck(run, rel), b"v99")
    return (rel,)


def missing_state_version(run, n):
    """Every file of version n+1 in partition 0 (delta/snapshot, changelog/zip) is gone."""
    d = store_dir(run, 0)
    for name in names(d):
        if name.endswith((".delta", ".snapshot", ".zip", ".changelog")) and version_of(name) == n + 1:
            remove_with_sidecars(os.path.join(d, name))
    return (f"state/0/0/{n + 1}",)


def missing_base_snapshots(run, n):
    """Every snapshot (HDFS) or zip (RocksDB) at or below version n+1 in partition 0 is gone."""
    d = store_dir(run, 0)
    for name in names(d):
        if name.endswith((".snapshot", ".zip")) and version_of(name) <= n + 1:
            remove_with_sidecars(os.path.join(d, name))
    return ("state/0/0",)


def truncated_chain_file(run, n):
    """The file version n+1 loads from in partition 1 (its snapshot if there is one, else its delta)."""
    d = store_dir(run, 1)
    snap = os.path.join(d, f"{n + 1}.snapshot")
    path = snap if os.path.exists(snap) else os.path.join(d, f"{n + 1}.delta")
    halve(path)
    return (os.path.relpath(path, run.checkpoint),)


def truncated_base_zip(run, n):
    path = base_zip(run, n + 1, 1)
    halve(path)
    return (os.path.relpath(path, run.checkpoint),)


def garbage_base_zip(run, n):
    path = base_zip(run, n + 1, 0)
    write(path, b"\x00garbage" * (os.path.getsize(path) // 8 + 1))
    return (os.path.relpath(path, run.checkpoint),)


def missing_sst(run, n):
    sst = chain_sst(run, n + 1)
    remove_with_sidecars(sst)
    return (os.path.relpath(sst, run.checkpoint),)


def v2_uid_without_file(run, n):
    uid = commit_uid(run, n, 0)
    d = store_dir(run, 0)
    for name in names(d):
        if name.startswith(f"{n + 1}_{uid}.") and not name.endswith(".crc"):
            remove_with_sidecars(os.path.join(d, name))
    return (f"state/0/0/{n + 1}_{uid}",)


def v2_missing_sst(run, n):
    sst = chain_sst(run, n + 1)
    remove_with_sidecars(sst)
    return (os.path.relpath(sst, run.checkpoint),)


def _replayed_changelog(run, n) -> str:
    """The changelog of version n+1 in a partition where that version has no zip (so the load reads it)."""
    for part in (1, 0):
        uid = commit_uid(run, n, part)
        if not os.path.exists(ck(run, f"state/0/{part}/{n + 1}_{uid}.zip")):
            return f"state/0/{part}/{n + 1}_{uid}.changelog"
    raise AssertionError(f"version {n + 1} has a zip in every partition (choose the target with changelog_target)")


def changelog_target(run) -> int:
    """The rollback target for a damaged changelog: ``target_before_last_compaction``, or the nearest batch
    below it whose restart replays a changelog in some partition. Spark's maintenance uploads zips on its
    own clock, so which versions have one is timing: version n+1 may have a zip in every partition, and a
    restart then reads no changelog of it (a case aimed there would be vacuous)."""
    n = target_before_last_compaction(run)
    for target in range(n, n - 4, -1):
        try:
            _replayed_changelog(run, target)
            return target
        except AssertionError:
            continue
    raise AssertionError(f"versions {n - 2}..{n + 1} have a zip in every partition: no changelog is replayed")


def v2_stale_checksum(run, n):
    rel = _replayed_changelog(run, n)
    path = ck(run, rel + ".crc")  # Spark's own checksum file of the changelog (JSON), not a Hadoop sidecar
    doc = json.loads(open(path).read())
    doc["value"] = doc["value"] + 1
    write(path, json.dumps(doc, separators=(",", ":")).encode())
    return (rel,)


def v2_zero_changelog(run, n):
    """The changelog of version n+1 in a partition where that version has no zip (so the load reads it)."""
    rel = _replayed_changelog(run, n)
    write(ck(run, rel), b"")
    return (rel,)


def v2_zero_loaded_file(run, n):
    """The file the load of version n+1 reads emptied: its changelog in a partition where that version has no zip,
    else (Spark's maintenance uploaded a zip of it in every partition: timing, seen in a fresh-clone run) the zip
    of partition 0. A backup cuts at the last commit, so it cannot move the target as ``changelog_target`` does."""
    try:
        rel = _replayed_changelog(run, n)
    except AssertionError:
        rel = f"state/0/0/{n + 1}_{commit_uid(run, n, 0)}.zip"
        assert os.path.exists(ck(run, rel)), rel
    write(ck(run, rel), b"")
    return (rel,)


def stale_crc_same_size(run, n):
    """offsets/n edited in place (same length, still valid JSON) without updating .n.crc."""
    p = ck(run, f"offsets/{n}")
    data = bytearray(open(p, "rb").read())
    i = data.index(b'"batchTimestampMs":') + len(b'"batchTimestampMs":')
    data[i + 3] = ord("0") if data[i + 3] != ord("0") else ord("1")
    write(p, bytes(data))
    return (f"offsets/{n}", f"offsets/.{n}.crc")


def stale_crc_sink_plain(run, n):
    from checkpoint_ops.storage.checksums import hadoop_crc_bytes

    rel = sink_log(run, n)
    d, name = os.path.split(os.path.join(run.output, rel))
    write(os.path.join(d, f".{name}.crc"), hadoop_crc_bytes(b"x" * 2000))
    return (rel, f"_spark_metadata/.{name}.crc")


def sink_log_gap(run, n):
    rel = sink_log(run, n)
    remove_with_sidecars(os.path.join(run.output, rel))
    return (rel,)


def torn_sink_compact(run, n):
    c = (n + 1) // 5 * 5 - 1
    rel = f"_spark_metadata/{c}.compact"
    write(os.path.join(run.output, rel), b"")
    return (rel,)


def missing_sink_compact(run, n):
    c = (n + 1) // 5 * 5 - 1
    rel = f"_spark_metadata/{c}.compact"
    remove_with_sidecars(os.path.join(run.output, rel))
    # with it gone, the two compact files left are 10 apart: Spark derives interval 10 and reads c as plain
    return (rel, f"_spark_metadata/{c}")


def sink_data_gone(run, n):
    entries = [e for b in range(n, 0, -1) for e in (sink_entries(run, sink_log(run, b))
                                                    if os.path.exists(os.path.join(run.output, sink_log(run, b))) else [])]
    name = os.path.basename(entries[0]["path"])
    remove_with_sidecars(os.path.join(run.output, name))
    return (name,)


def enormous_line(run, n):
    write(ck(run, f"commits/{n}"), b"v1\n{" + b'"x":' * (8 * 2**20))
    return (f"commits/{n}",)


def symlink_loop(run, n):
    p = ck(run, f"offsets/{n - 1}")
    remove_with_sidecars(p)
    os.symlink(p, p)
    return (f"offsets/{n - 1}",)


def fifo_instead_of_file(run, n):
    """A named pipe where a log file was (made by hand, or by a copy tool that keeps special files): opening it
    waits for a writer for ever. Every command must name it and end."""
    p = ck(run, f"offsets/{n - 1}")
    remove_with_sidecars(p)
    os.mkfifo(p)
    return (f"offsets/{n - 1}",)


def directory_instead_of_file(run, n):
    p = ck(run, f"commits/{n}")
    remove_with_sidecars(p)
    os.mkdir(p)
    return (f"commits/{n}",)


def permission_denied(run, n):
    os.chmod(ck(run, f"offsets/{n}"), 0)
    return (f"offsets/{n}",)


def torn_latest_commit(run, n):
    write(ck(run, f"commits/{run.last_batch}"), b"")
    return (f"commits/{run.last_batch}",)


def v99_latest_offsets(run, n):
    set_version(ck(run, f"offsets/{run.last_batch}"), b"v99")
    return (f"offsets/{run.last_batch}",)


def binary_latest_sink_log(run, n):
    rel = sink_log(run, run.last_batch)
    write(os.path.join(run.output, rel), bytes(range(256)))
    return (rel,)


def truncated_latest_delta(run, n):
    rel = f"state/0/0/{run.last_batch + 1}.delta"
    halve(ck(run, rel))
    return (rel,)


def missing_state_partition(run, n):
    """A partition's whole state directory deleted (a partial copy, a clean-up by hand): Spark numbers the
    partitions from 0 and loads every one at every restart."""
    shutil.rmtree(ck(run, "state/0/1"))
    return ("state/0/1",)


def missing_state_metadata_and_partition(run, n):
    """The same without the operator metadata: the offsets log's pinned spark.sql.shuffle.partitions says
    how many partitions there are."""
    shutil.rmtree(ck(run, "state/0/_metadata"))
    return missing_state_partition(run, n)


def zero_commit_between(run, n):
    b = n + 2
    write(ck(run, f"commits/{b}"), b"")
    return (f"commits/{b}",)


def leftover_tmp_offsets(run, n):
    rel = f"offsets/.{run.last_batch + 1}.1b2c3d4e-aaaa-bbbb-cccc-123456789abc.tmp"
    write(ck(run, rel), b'v1\n{"batchWat')
    return (rel,)


def leftover_tmp_state(run, n):
    rel = f"state/0/1/.{run.last_batch + 2}.delta.1b2c3d4e-aaaa-bbbb-cccc-123456789abc.TID7.tmp"
    write(ck(run, rel), b"LZ4Block")
    return (rel,)


def v99_latest_source_log(run, n):
    d = ck(run, "sources/0")
    newest = max(names(d), key=version_of)
    set_version(os.path.join(d, newest), b"v99")
    return (f"sources/0/{newest}",)


def commits_ahead(run, n):
    remove_with_sidecars(ck(run, f"offsets/{run.last_batch}"))
    return (f"commits/{run.last_batch}", f"offsets/{run.last_batch}")


def sink_log_behind(run, n):
    """The sink log entry of the last batch is gone while commits/<last> is there (the sink is behind)."""
    rel = f"_spark_metadata/{run.last_batch}"
    assert os.path.exists(os.path.join(run.output, rel)), "the fixture ends on a plain sink log file"
    remove_with_sidecars(os.path.join(run.output, rel))
    return (rel,)


def another_querys_output(run, n):
    """Nothing damaged: the --sink is the output of another flavour's query (the case names it)."""
    return ()


def torn_oldest_offsets(run, n):
    b = min(int(x) for x in names(ck(run, "offsets")))
    assert b < n - 1
    write(ck(run, f"offsets/{b}"), b"")
    return (f"offsets/{b}",)


LOGS = {"inspect", "offsets", "ledger"}
CASES = [
    # in the restart set of n: refused, exit 2
    Case("torn_offsets_n", "hdfs", torn_offsets_n, "restart", LOGS),
    Case("truncated_offsets_prev", "rocksdb", truncated_offsets_prev, "restart", LOGS, offsets_shown=True),
    Case("truncated_offsets_n", "rocksdb_v2", truncated_offsets_n, "restart", LOGS),
    Case("binary_commit_n", "rocksdb_v2", binary_commit_n, "restart", LOGS, offsets_shown=True),
    Case("bare_commit_n", "hdfs", bare_commit_n, "restart", LOGS, offsets_shown=True),
    Case("v99_commit_n", "hdfs", v99_commit_n, "restart", LOGS, offsets_shown=True),
    Case("v99_offsets_n", "rocksdb_v2", v99_offsets_n, "restart", LOGS),
    Case("json_garbage_offsets_prev", "rocksdb", json_garbage_offsets_prev, "restart", LOGS, offsets_shown=True),
    Case("missing_metadata", "hdfs", missing_metadata, "restart", {"inspect"}),
    Case("garbage_metadata", "rocksdb", garbage_metadata, "restart", {"inspect"}),
    Case("empty_metadata", "rocksdb_v2", empty_metadata, "restart", {"inspect"}),
    Case("offsets_gap_prev", "hdfs", offsets_gap_prev, "restart", {"inspect", "offsets"}, offsets_shown=True),
    Case("commits_missing_n", "rocksdb", commits_missing_n, "restart", {"inspect"}),
    Case("torn_source_entry", "rocksdb_v2", torn_source_entry, "restart", {"inspect"}),
    Case("truncated_source_compact", "hdfs", truncated_source_compact, "restart", {"inspect"}),
    Case("v99_source_plain", "rocksdb", v99_source_plain, "restart", {"inspect"}),
    Case("missing_hdfs_version", "hdfs", missing_state_version, "restart", {"inspect"}),
    Case("missing_hdfs_snapshots", "hdfs", missing_base_snapshots, "restart", {"inspect"}),
    Case("truncated_hdfs_chain_file", "hdfs", truncated_chain_file, "restart"),
    Case("missing_rocksdb_version", "rocksdb", missing_state_version, "restart", {"inspect"}),
    Case("missing_rocksdb_zips", "rocksdb", missing_base_snapshots, "restart", {"inspect"}),
    Case("truncated_rocksdb_zip", "rocksdb", truncated_base_zip, "restart"),
    Case("garbage_rocksdb_zip", "rocksdb", garbage_base_zip, "restart"),
    Case("missing_sst", "rocksdb", missing_sst, "restart"),
    Case("missing_hdfs_partition", "hdfs", missing_state_partition, "restart", {"inspect"}),
    Case("missing_rocksdb_partition_and_metadata", "rocksdb", missing_state_metadata_and_partition, "restart",
         {"inspect"}),
    Case("v2_missing_partition", "rocksdb_v2", missing_state_partition, "restart", {"inspect"}),
    Case("v2_unique_id_without_file", "rocksdb_v2", v2_uid_without_file, "restart", {"inspect"}),
    Case("v2_missing_sst", "rocksdb_v2", v2_missing_sst, "restart"),
    Case("v2_stale_spark_checksum", "rocksdb_v2", v2_stale_checksum, "restart", target=changelog_target),
    Case("v2_zero_byte_changelog", "rocksdb_v2", v2_zero_changelog, "restart", {"inspect"}, target=changelog_target),
    # a log file's stale Hadoop sidecar: Spark does not check it (tests/test_stale_crc_spark.py), so it is no
    # damage to a rollback; fsck names it (a warning)
    Case("stale_crc_same_size", "hdfs", stale_crc_same_size, "elsewhere"),
    Case("stale_crc_sink_log", "rocksdb", stale_crc_sink_plain, "elsewhere"),
    Case("sink_log_gap", "rocksdb", sink_log_gap, "restart", {"inspect"}),
    Case("torn_sink_compact", "hdfs", torn_sink_compact, "restart", {"inspect", "ledger"}),
    Case("missing_sink_compact", "hdfs", missing_sink_compact, "restart", {"inspect"}),
    Case("sink_data_file_gone", "rocksdb_v2", sink_data_gone, "restart", {"inspect"}),
    Case("enormous_line", "hdfs", enormous_line, "restart", LOGS, offsets_shown=True),
    Case("symlink_loop", "rocksdb", symlink_loop, "restart", LOGS, offsets_shown=True),
    Case("directory_instead_of_file", "rocksdb_v2", directory_instead_of_file, "restart", LOGS, offsets_shown=True),
    Case("fifo_instead_of_file", "hdfs", fifo_instead_of_file, "restart", LOGS, offsets_shown=True),
    Case("permission_denied", "hdfs", permission_denied, "restart", LOGS, unprivileged=True),
    # in what the rollback removes: a repair the plan announces
    Case("torn_latest_commit", "rocksdb_v2", torn_latest_commit, "removed", {"inspect", "ledger"}),
    Case("v99_latest_offsets", "hdfs", v99_latest_offsets, "removed", {"inspect", "ledger"}),
    Case("binary_latest_sink_log", "rocksdb_v2", binary_latest_sink_log, "removed", {"inspect", "ledger"}),
    Case("truncated_latest_delta", "hdfs", truncated_latest_delta, "removed"),
    Case("zero_byte_commit_between", "rocksdb", zero_commit_between, "removed", {"inspect", "ledger"}),
    Case("leftover_tmp_offsets", "rocksdb_v2", leftover_tmp_offsets, "removed"),
    Case("leftover_tmp_state", "hdfs", leftover_tmp_state, "removed"),
    Case("v99_latest_source_log", "rocksdb", v99_latest_source_log, "removed", {"inspect"}),
    Case("commits_ahead_of_offsets", "rocksdb", commits_ahead, "removed", {"inspect"}),
    Case("sink_log_behind_its_checkpoint", "hdfs", sink_log_behind, "removed"),
    # the sink is not the checkpoint's
    Case("another_querys_output", "rocksdb", another_querys_output, "refused", {"ledger"}, sink_from="hdfs"),
    # neither: the rollback does not need it
    Case("torn_oldest_offsets", "rocksdb", torn_oldest_offsets, "elsewhere", {"inspect", "ledger"}),
]


def expected(case: Case) -> dict[str, tuple[int, bool]]:
    """command -> (exit code, whether its output names the damaged file)."""
    rollback = {"restart": (2, True), "removed": (0, True), "elsewhere": (0, False), "refused": (1, True)}[case.where]
    return {
        "inspect": (0, "inspect" in case.reads),
        "offsets": ((1, True) if case.offsets_shown else (2, True)) if "offsets" in case.reads else (0, False),
        "fsck --deep": (1, True),
        "rollback --dry-run": rollback,
        "undo": (1, False),
        "history": (0, False),
        "prune --dry-run": (0, False),
        "ledger sync": (1, True) if "ledger" in case.reads else (0, False),
        "rollback --yes": rollback,
    }


def commands(run, n: int, out: str) -> dict[str, list]:
    c = run.checkpoint
    return {
        "inspect": ["inspect", c, "--sink", out, *INTERVALS],
        "offsets": ["offsets", c, "--batch", n, *INTERVALS[:2]],
        "fsck --deep": ["fsck", c, "--sink", out, "--deep", *INTERVALS],
        "rollback --dry-run": ["rollback", c, "--to-batch", n, "--sink", out, *INTERVALS, "--dry-run", "--json"],
        "undo": ["undo", c, "--yes"],
        "history": ["history", c],
        "prune --dry-run": ["prune", c, "--keep-last", "1", "--dry-run"],
        "ledger sync": ["ledger", "sync", c, "--sink", out, *INTERVALS],
        "rollback --yes": ["rollback", c, "--to-batch", n, "--sink", out, *INTERVALS, "--yes", "--json"],
    }


def tree_hash(*roots: str, skip: tuple[str, ...] = ()) -> str:
    """One digest over every entry (files by content, links by target, directories by name), except the
    files named in ``skip``."""
    h = hashlib.sha256()
    for root in roots:
        for d, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for n in sorted(files + [x for x in dirs if os.path.islink(os.path.join(d, x))]):
                if n in skip:
                    continue
                p = os.path.join(d, n)
                h.update(os.path.relpath(p, root).encode() + b"\0")
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    h.update(b"link:" + os.readlink(p).encode())
                elif not stat.S_ISREG(st.st_mode):  # a named pipe: opened, it would wait for a writer
                    h.update(b"special:%o" % st.st_mode)
                else:
                    h.update(b"%o:" % st.st_mode)
                    with open(p, "rb") as f:
                        h.update(hashlib.sha256(f.read()).digest())
            h.update(b"dirs:" + "\0".join(dirs).encode())
    return h.hexdigest()


def without_root_override(*args) -> tuple[int, str, str]:
    """The CLI as a subprocess without the capabilities that let root read any file: a permission
    case run as plain root would prove nothing (util-linux ``setpriv`` drops them)."""
    caps = "-dac_override,-dac_read_search"
    p = subprocess.run(["setpriv", "--bounding-set", caps, "--inh-caps", caps, "--",
                        sys.executable, "-m", "checkpoint_ops.cli", *map(str, args)],
                       cwd=ROOT, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input(spark, spark_runs, case: Case):
    run = spark_runs(case.flavour)
    run.reset()
    other = spark_runs(case.sink_from) if case.sink_from else None
    if other is not None:
        other.reset()
    sink = other.output if other is not None else run.output
    n = (case.target or target_before_last_compaction)(run)
    runner = without_root_override if case.unprivileged and os.geteuid() == 0 else cli
    try:
        named_as = case.damage(run, n) + ((sink,) if other is not None else ())
        roots = (run.checkpoint, run.output) + ((sink,) if other is not None else ())
        cmds = commands(run, n, sink)
        for name, (want_code, want_named) in expected(case).items():
            # ledger sync may record the pairing beside the sink log: checked below, not part of the tree
            skip = (PAIRING_FILE, f".{PAIRING_FILE}.crc") if name == "ledger sync" else ()
            before = tree_hash(*roots, skip=skip)
            code, out, err = runner(*cmds[name])
            named = any(x in out + err for x in named_as)
            assert "Traceback" not in err, f"{name}: {err[-3000:]}"
            assert (code, named or not want_named) == (want_code, True), \
                f"{case}: {name} gave exit {code}, named={named}; expected {want_code}, named={want_named}\n" \
                f"{out[-2000:]}\n{err[-2000:]}"
            if not (name == "rollback --yes" and code == 0):
                assert tree_hash(*roots, skip=skip) == before, f"{case}: {name} changed the tree"
            record = os.path.join(sink, PAIRING_FILE)
            if os.path.exists(record):  # only ever this checkpoint's own output, recorded by ledger sync
                assert other is None and json.load(open(record))["checkpoint"] == run.checkpoint, record
        if case.name == "missing_metadata":  # --force goes ahead, and says what it accepted
            code, out, err = runner(*cmds["rollback --dry-run"], "--force")
            assert code == 0 and "metadata is missing" in out, err
        if case.where == "removed":
            code, out, err = runner("fsck", run.checkpoint, "--sink", run.output, "--deep", *INTERVALS)
            assert code == 0, out
            assert finish_and_read(spark, run) == exact(run)
    finally:
        run.reset()
        if other is not None:
            other.reset()


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 40
    assert {c.flavour for c in CASES} == {"hdfs", "rocksdb", "rocksdb_v2"}
    assert {c.where for c in CASES} == {"restart", "removed", "elsewhere", "refused"}


# ---- backups: an unusable source, a damaged manifest ------------------------------------------------------
#
# ``backup create`` from a source it cannot use exits non-zero naming the file, and leaves nothing at the
# destination: a new one is not created, an existing one is unchanged (no marker, object or intent). A
# damaged manifest is listed as damaged; verifying or restoring it is exit 2 naming it; every other
# backup stays listable, verifiable and restorable, new backups proceed, and object collection waits.


@dataclass
class SourceCase:
    name: str
    flavour: str
    damage: Callable  # (run, tmp) -> (checkpoint to back up, its sinks, the names a message may use)
    code: int = 2
    unprivileged: bool = False
    # an existing destination (holding a backup of the intact checkpoint) refuses too; False where the
    # incremental backup rightly does not read the damaged file again (it is unchanged since then)
    existing: bool = True

    def __str__(self):
        return self.name


def _at_last_commit(damage):
    """A corpus damage aimed at the restart after the last commit (where a backup cuts)."""
    def apply(run, tmp):
        return run.checkpoint, [run.output], damage(run, run.last_batch)
    return apply


def _readable_again(base: str) -> None:
    os.chmod(base, 0o755)
    for d, dirs, files in os.walk(base):  # top-down: each directory is fixed before it is listed
        for n in dirs:
            os.chmod(os.path.join(d, n), 0o755)
        for n in files:
            if not os.path.islink(os.path.join(d, n)):
                os.chmod(os.path.join(d, n), 0o644)


def _nothing_there(run, tmp):
    return str(tmp / "nothing-here"), [], ("nothing-here",)


def _not_a_checkpoint(run, tmp):
    (tmp / "notes").mkdir()
    (tmp / "notes" / "readme.txt").write_text("not a checkpoint")
    return str(tmp / "notes"), [], ("notes",)


def _a_sink_output(run, tmp):
    return run.output, [], (run.output,)


def _missing_sink(run, tmp):
    return run.checkpoint, [str(tmp / "no-sink")], ("no-sink",)


def _unreadable_old_offsets(run, tmp):
    """Not in the restart set (an older batch): read only by the copy."""
    os.chmod(ck(run, f"offsets/{run.last_batch - 3}"), 0)
    return run.checkpoint, [run.output], (f"offsets/{run.last_batch - 3}",)


def _fifo_old_offsets(run, tmp):
    """A named pipe in place of an older batch's offsets (not in the restart set): read only by the copy, which
    waited for a writer for ever."""
    p = ck(run, f"offsets/{run.last_batch - 3}")
    remove_with_sidecars(p)
    os.mkfifo(p)
    return run.checkpoint, [run.output], (f"offsets/{run.last_batch - 3}",)


def _unreadable_commits_dir(run, tmp):
    os.chmod(ck(run, "commits"), 0)
    return run.checkpoint, [run.output], ("commits",)


def _unreadable_checkpoint(run, tmp):
    os.chmod(run.checkpoint, 0)
    return run.checkpoint, [run.output], (run.checkpoint,)


def _no_commit_yet(run, tmp):
    for name in names(ck(run, "commits")):
        remove_with_sidecars(ck(run, f"commits/{name}"))
    return run.checkpoint, [run.output], (run.checkpoint,)


SOURCE_CASES = [
    SourceCase("source_missing", "hdfs", _nothing_there),
    SourceCase("source_not_a_checkpoint", "hdfs", _not_a_checkpoint),
    SourceCase("source_is_a_sink_output", "hdfs", _a_sink_output),
    SourceCase("source_sink_missing", "hdfs", _missing_sink),
    SourceCase("source_unreadable_file", "hdfs", _unreadable_old_offsets, unprivileged=True, existing=False),
    SourceCase("source_unreadable_directory", "rocksdb", _unreadable_commits_dir, unprivileged=True),
    SourceCase("source_fifo_instead_of_a_file", "rocksdb_v2", _fifo_old_offsets),
    SourceCase("source_unreadable_checkpoint", "rocksdb_v2", _unreadable_checkpoint, unprivileged=True),
    SourceCase("source_no_commit_yet", "hdfs", _no_commit_yet, code=1),
    SourceCase("source_missing_metadata", "rocksdb", _at_last_commit(missing_metadata)),
    SourceCase("source_v99_latest_offsets", "hdfs", _at_last_commit(v99_latest_offsets)),
    SourceCase("source_binary_latest_sink_log", "rocksdb_v2", _at_last_commit(binary_latest_sink_log)),
    SourceCase("source_truncated_latest_state_file", "hdfs", _at_last_commit(truncated_chain_file)),
    SourceCase("source_missing_rocksdb_version", "rocksdb", _at_last_commit(missing_state_version)),
    SourceCase("source_garbage_rocksdb_zip", "rocksdb", _at_last_commit(garbage_base_zip)),
    SourceCase("source_v2_unique_id_without_file", "rocksdb_v2", _at_last_commit(v2_uid_without_file)),
    SourceCase("source_v2_zero_byte_state_file", "rocksdb_v2", _at_last_commit(v2_zero_loaded_file)),
    SourceCase("source_missing_state_partition", "hdfs", _at_last_commit(missing_state_partition)),
]


@pytest.mark.parametrize("case", SOURCE_CASES, ids=str)
def test_backup_of_an_unusable_source_writes_nothing(spark, spark_runs, case: SourceCase, tmp_path):
    run = spark_runs(case.flavour)
    run.reset()
    existing = str(tmp_path / "existing")  # already holds a backup of the intact checkpoint
    code, out, err = cli("backup", "create", run.checkpoint, existing, "--sink", run.output, *INTERVALS)
    assert code == 0, err
    runner = without_root_override if case.unprivileged and os.geteuid() == 0 else cli
    try:
        ckpt, sinks, named_as = case.damage(run, tmp_path)
        roots = [r for r in (run.checkpoint, run.output, existing) if os.path.exists(r)]
        before = tree_hash(*roots)
        for dest in [str(tmp_path / "new")] + ([existing] if case.existing else []):
            code, out, err = runner("backup", "create", ckpt, dest, *[a for s in sinks for a in ("--sink", s)],
                                    *INTERVALS)
            assert "Traceback" not in err, err[-3000:]
            assert (code, any(x in err for x in named_as)) == (case.code, True), \
                f"{case}: backup create to {dest} gave exit {code}\n{out[-2000:]}\n{err[-2000:]}"
        assert not os.path.exists(tmp_path / "new"), f"{case}: the destination was created"
        assert tree_hash(*roots) == before, f"{case}: something changed"
    finally:
        _readable_again(run.base)
        run.reset()


@dataclass
class ManifestCase:
    name: str
    damage: Callable  # the manifest's JSON document -> the bytes written in its place
    says: str  # the problem names this

    def __str__(self):
        return self.name


def _edit(change):
    def apply(doc):
        change(doc)
        return json.dumps(doc).encode()
    return apply


def _entry(i, value):
    return _edit(lambda d: d["roots"]["checkpoint"]["files"][0].__setitem__(i, value))


def _compact(change):
    """An edit that keeps the manifest's layout (compact, its digest last): a change by hand, or damage that still
    parses, found only by the digest."""
    def apply(doc):
        change(doc)
        return json.dumps(doc, separators=(",", ":")).encode()
    return apply


def _drop_entry(prefix: str):
    def change(doc):
        files = doc["roots"]["checkpoint"]["files"]
        files.remove(max((f for f in files if f[0].startswith(prefix)), key=lambda f: int(f[0].split("/")[1])))
    return change


def _rename_entry(prefix: str, to: str):
    def change(doc):
        files = doc["roots"]["checkpoint"]["files"]
        max((f for f in files if f[0].startswith(prefix)), key=lambda f: int(f[0].split("/")[1]))[0] = to
    return change


MANIFEST_CASES = [
    ManifestCase("manifest_entry_dropped", _compact(_drop_entry("offsets/")), "does not match the digest it records"),
    ManifestCase("manifest_entry_renamed", _compact(_rename_entry("commits/", "commits/99")),
                 "does not match the digest it records"),
    ManifestCase("manifest_pretty_printed_and_edited", lambda doc: json.dumps(
        {**doc, "created": doc["created"].replace("20", "19", 1)}, indent=2).encode(), "does not match the digest"),
    ManifestCase("manifest_not_json", lambda doc: json.dumps(doc).encode()[:-20], "is not JSON"),
    ManifestCase("manifest_empty", lambda doc: b"", "is not JSON"),
    ManifestCase("manifest_not_an_object", lambda doc: b"[1, 2, 3]", "is not a JSON object"),
    ManifestCase("manifest_unknown_format", _edit(lambda d: d.update(format=99)), "is format 99, newer"),
    ManifestCase("manifest_no_format", _edit(lambda d: d.pop("format")), "no format version"),
    ManifestCase("manifest_roots_not_an_object", _edit(lambda d: d.update(roots=[])), "lists no checkpoint root"),
    ManifestCase("manifest_entry_not_a_list", _edit(lambda d: d["roots"]["checkpoint"]["files"].__setitem__(
        0, "metadata")), "that is not [path, sha256, size, mtime]"),
    ManifestCase("manifest_path_outside_root", _entry(0, "../../escape"), "'../../escape', which would leave its root"),
    ManifestCase("manifest_absolute_path", _entry(0, "/etc/passwd"), "'/etc/passwd', which is not a relative path"),
    ManifestCase("manifest_url_as_path", _entry(0, "s3://bucket/key"), "which is not a relative path"),
    ManifestCase("manifest_hash_not_a_hash", _entry(1, "../../../../etc/passwd"), "which is not a sha256"),
    ManifestCase("manifest_negative_size", _entry(2, -1), "not a byte count"),
    ManifestCase("manifest_of_another_backup", _edit(lambda d: d.update(id="someone-else")),
                 "says it is backup 'someone-else'"),
    ManifestCase("manifest_unknown_root", _edit(lambda d: d["roots"].update({"../x": d["roots"]["checkpoint"]})),
                 "has a root named '../x'"),
]


@pytest.fixture(scope="module")
def two_backups(spark, spark_runs, tmp_path_factory):
    """A destination holding two backups of the intact hdfs run: the older verified, the newer to damage."""
    run = spark_runs("hdfs")
    run.reset()
    dest = str(tmp_path_factory.mktemp("two-backups") / "dest")
    ids = []
    for _ in range(2):
        code, out, err = cli("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS, "--json")
        assert code == 0, err
        ids.append(json.loads(out)["backup_id"])
    assert cli("backup", "verify", dest, ids[0])[0] == 0
    return run, dest, ids


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=str)
def test_a_damaged_manifest_is_named_and_the_others_stay_usable(two_backups, case: ManifestCase, tmp_path):
    run, pristine, (good, bad) = two_backups
    run.reset()
    dest = str(tmp_path / "dest")
    shutil.copytree(pristine, dest)
    rel = os.path.join("manifests", f"{bad}.json")
    with open(os.path.join(dest, rel), "rb") as f:
        doc = json.loads(f.read())
    write(os.path.join(dest, rel), case.damage(doc))
    target = tmp_path / "target"

    def run_cli(*args, code: int, names: bool = True, changes: bool = False) -> str:
        before = tree_hash(dest)
        got, out, err = cli(*map(str, args))
        assert "Traceback" not in err, err[-3000:]
        assert got == code, f"{case}: {args[:2]} gave exit {got}, expected {code}\n{out[-2000:]}\n{err[-2000:]}"
        assert not names or (case.says in out + err and rel in out + err), f"{case}: {args[:2]}\n{out}\n{err}"
        assert changes or tree_hash(dest) == before, f"{case}: {args[:2]} changed the destination"
        return out

    rows = json.loads(run_cli("backup", "list", dest, "--json", code=0, names=False))["backups"]
    assert [(r["id"], r["status"]) for r in rows] == [(good, "verified"), (bad, "damaged")]
    assert case.says in rows[1]["damaged"] and rows[1]["verified"] == "FAILED"
    run_cli("backup", "verify", dest, bad, code=2)
    run_cli("backup", "restore", dest, bad, target / "ckpt", "--sink-target", target / "out", "--yes", code=2)
    assert not target.exists()
    run_cli("backup", "prune", dest, "--keep-last", "1", "--dry-run", code=0)  # objects blocked, it says why
    run_cli("backup", "verify", dest, code=1, changes=True)  # the good one verified (and recorded), this one named
    run_cli("backup", "verify", dest, good, code=0, names=False, changes=True)
    run_cli("backup", "restore", dest, good, target / "ckpt", "--sink-target", target / "out", "--dry-run", code=0,
            names=False)
    out = run_cli("backup", "create", run.checkpoint, dest, "--sink", run.output, *INTERVALS, "--json", code=0,
                  names=False, changes=True)
    assert json.loads(out)["parent"] == good  # never the damaged one


def test_the_backup_tables_cover_each_kind():
    assert {c.flavour for c in SOURCE_CASES} == {"hdfs", "rocksdb", "rocksdb_v2"}
    assert {c.code for c in SOURCE_CASES} == {1, 2} and any(c.unprivileged for c in SOURCE_CASES)
    assert len(MANIFEST_CASES) >= 10
