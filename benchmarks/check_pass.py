"""Benchmark: what the materialization's checks cost as the checkpoint grows, in CPU time.

A synthetic checkpoint (``synthetic.py``: Spark's real names and formats, one HDFS operator, a file
source) with a file sink beside it (``_spark_metadata`` compacted every 10, one data file per batch),
retaining ``N`` batches of logs. After each "run" (``--new`` batches appended, as Spark appends them:
new log files, new data files), measured side by side in this process, in CPU seconds
(``time.process_time``, which the shared machine's load does not inflate the way it does wall time):

* (before) what a materialization did: ``ledger sync``, then ``inspect`` on a new model, then the health
  check's ``fsck`` on another, each reading every retained log file;
* (now) ``check_pass.run_check_pass`` (one model, one window, the verdict cache and its window memo)
  then the health check's ``shared_fsck``, each with the collector's thresholds raised as the Dagster
  layer runs them (``collector.py``; "before" keeps Python's defaults, as the materialization then did).

Usage: ``python benchmarks/check_pass.py [--sizes 10,1000,10000] [--new 10] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from checkpoint_ops.check_pass import run_check_pass, shared_fsck  # noqa: E402
from checkpoint_ops.collector import fewer_collections  # noqa: E402
from checkpoint_ops.fsck import run_fsck  # noqa: E402
from checkpoint_ops.inspect import inspect_checkpoint  # noqa: E402
from checkpoint_ops.ledger import Ledger  # noqa: E402
from checkpoint_ops.ledger import sync as sync_ledger  # noqa: E402
from checkpoint_ops.model.checkpoint import Checkpoint, open_sink  # noqa: E402
from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_name  # noqa: E402

T0 = 1_790_000_000_000
INTERVAL = 10


def _write(path: str, data: bytes, mtime: float) -> None:
    with open(path, "wb") as f:
        f.write(data)
    d, name = os.path.split(path)
    with open(os.path.join(d, hadoop_crc_name(name)), "wb") as f:
        f.write(hadoop_crc_bytes(data))
    for p in (path, os.path.join(d, hadoop_crc_name(name))):
        os.utime(p, (mtime, mtime))


class Stream:
    """A checkpoint and its sink, advanced a batch at a time as Spark would (logs retained: ``retain``)."""

    def __init__(self, root: str, retain: int):
        self.ckpt, self.out = os.path.join(root, "q", "ckpt"), os.path.join(root, "q", "out")
        self.retain = retain
        self.next = 0
        self.entries: list[str] = []
        for d in ("offsets", "commits", "sources/0", "state/0/0"):
            os.makedirs(os.path.join(self.ckpt, d), exist_ok=True)
        os.makedirs(os.path.join(self.out, "_spark_metadata"), exist_ok=True)
        with open(os.path.join(self.ckpt, "metadata"), "w") as f:
            f.write('{"id":"6f0c1c9e-7c1b-4a5e-9d38-1c0d2b3e4f50"}')
        self.clock = time.time() - 10 * 365 * 86400  # the past, ten seconds a batch (MTIME_SLACK)

    def batch(self) -> None:
        b = self.next
        self.clock += 10
        conf = {"spark.sql.streaming.stateStore.providerClass":
                "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
                "spark.sql.shuffle.partitions": "1"}
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": T0 + b * 10_000, "conf": conf}
        _write(os.path.join(self.ckpt, "offsets", str(b)),
               f"v1\n{json.dumps(meta, separators=(',', ':'))}\n{{\"logOffset\":{b}}}".encode(), self.clock)
        src = json.dumps({"path": f"file:///in/part-{b:06d}.json", "timestamp": T0 + b, "batchId": b},
                         separators=(",", ":"))
        name = f"part-{b:06d}-c0ffee.snappy.parquet"
        _write(os.path.join(self.out, name), b"PAR1" + b"x" * 100, self.clock)
        self.entries.append(json.dumps({"path": f"file://{self.out}/{name}", "size": 104, "isDir": False,
                                        "modificationTime": T0 + b * 10_000 + 500, "blockReplication": 1,
                                        "blockSize": 33554432, "action": "add"}, separators=(",", ":")))
        if (b + 1) % INTERVAL == 0:
            srcs = [json.dumps({"path": f"file:///in/part-{k:06d}.json", "timestamp": T0 + k, "batchId": k},
                               separators=(",", ":")) for k in range(b + 1)]
            _write(os.path.join(self.ckpt, "sources/0", f"{b}.compact"), "\n".join(["v1", *srcs]).encode(), self.clock)
            _write(os.path.join(self.out, "_spark_metadata", f"{b}.compact"),
                   "\n".join(["v1", *self.entries]).encode(), self.clock)
        else:
            _write(os.path.join(self.ckpt, "sources/0", str(b)), f"v1\n{src}".encode(), self.clock)
            _write(os.path.join(self.out, "_spark_metadata", str(b)), f"v1\n{self.entries[-1]}".encode(), self.clock)
        _write(os.path.join(self.ckpt, "commits", str(b)), b'v1\n{"nextBatchWatermarkMs":0}', self.clock)
        self.next += 1
        self._retention()

    def _retention(self) -> None:
        """Spark's purge of offsets/commits/source log below ``next - retain`` (log files kept for
        the oldest retained batch)."""
        low = self.next - self.retain
        if low <= 0:
            return
        for d in ("offsets", "commits"):
            for name in (str(low - 1), hadoop_crc_name(str(low - 1))):
                p = os.path.join(self.ckpt, d, name)
                if os.path.exists(p):
                    os.remove(p)

    def model(self):
        return Checkpoint.open(self.ckpt), [open_sink(self.out)]


def before(s: Stream) -> float:
    t = time.process_time()
    ckpt, sinks = s.model()
    sync_ledger(ckpt, sinks)
    ckpt, sinks = s.model()
    inspect_checkpoint(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))
    ckpt, sinks = s.model()
    run_fsck(ckpt, sinks, ledger=Ledger.for_checkpoint(ckpt))
    return time.process_time() - t


def now(s: Stream) -> tuple[float, int, int]:
    t = time.process_time()
    with fewer_collections():  # as the Dagster layer runs them (collector.py)
        ckpt, sinks = s.model()
        p = run_check_pass(ckpt, sinks, batches=False)  # as the asset runs it: no per-batch list
    with fewer_collections():
        ckpt, sinks = s.model()
        shared_fsck(ckpt, sinks)
    return time.process_time() - t, p.cache_hits, p.window_hits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,1000,10000")
    ap.add_argument("--new", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="check-pass-")
    rows = []
    try:
        for size in (int(x) for x in args.sizes.split(",")):
            s = Stream(os.path.join(work, str(size)), size)
            for _ in range(size):
                s.batch()
            now(s)  # the first pass fills the cache (a checkpoint's first materialization)
            b, n, hits, memo = [], [], [], []
            for r in range(args.rounds):
                for _ in range(args.new):
                    s.batch()
                # both on the same state: "before" first writes only the ledger (the pass then has
                # nothing new to sync either way)
                b.append(before(s))
                cpu, h, w = now(s)
                n.append(cpu)
                hits.append(h)
                memo.append(w)
            rows.append((size, statistics.median(b), statistics.median(n), statistics.median(hits),
                         statistics.median(memo), os.getloadavg()[0]))
            print(f"[{size}] before {b} now {n}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"`python benchmarks/check_pass.py --sizes {args.sizes} --new {args.new} --rounds {args.rounds}` "
          f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}); medians, CPU "
          f"seconds:\n")
    print("| retained batches | before: sync + inspect + fsck, each reading everything | now: one pass + the "
          "health check | now / before | log files the cache answered | batches the window memo answered "
          "| load average |")
    print("|---|---|---|---|---|---|---|")
    for size, b, n, hits, memo, load in rows:
        print(f"| {size:,} | {b:.3f} | {n:.3f} | **{n / b:.2f}x** | {hits:,} | {memo:,} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
