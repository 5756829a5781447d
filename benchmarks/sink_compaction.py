"""Benchmark: offline compaction of a file-sink log of 1,000,000 entries over 10,000 batches.

The log is synthetic, in Spark's exact format (``SinkFileStatus`` lines, ``v1`` header, no trailing
newline), laid out as Spark leaves it with compact interval 10 after its own cleanup: the two newest
compact files (``9989.compact`` and ``9999.compact``, each holding every entry so far), the plain files
between them, and five plain files after the newest (batches up to 10,004).

Measured side by side, in one run, each on a fresh copy, in a child process (wall time and peak RSS):

* ``checkpoint-ops sink compact OUTPUT --yes``: the ledger records the batches of the plain files that
  go, every entry readers see is streamed and checked, the superseded files are moved aside for undo;
* a naive compaction: read every entry of the newest compact and the files after it into memory
  (``json.loads``), then rewrite the compact file (``json.dumps``) — what SPARK-29995/SPARK-30462
  describe Spark itself doing, and what runs drivers out of memory.

Run for 100,000 and 1,000,000 entries to show memory stays flat as the log grows.

Usage: ``python benchmarks/sink_compaction.py [--entries 1000000 100000] [--batches 10000]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ENTRY = ('{{"path":"file:///data/tables/events/part-{part:05d}-{uuid}-c000.snappy.parquet","size":{size},'
         '"isDir":false,"modificationTime":{mtime},"blockReplication":1,"blockSize":33554432,"action":"add"}}')


def _entry(i: int) -> str:
    return ENTRY.format(part=i % 200, uuid=f"{i:08x}-7c16-4c31-a4e8-7b109a58aac1", size=4096 + i % 5000,
                        mtime=1_790_000_000_000 + i)


def write_log(out: str, entries: int, batches: int, interval: int = 10, after: int = 5) -> dict:
    """The sink log as Spark leaves it (see the module docstring); returns its shape."""
    log = os.path.join(out, "_spark_metadata")
    os.makedirs(log)
    per = entries // batches
    latest_compact = batches - 1
    prev_compact = latest_compact - interval

    def batch_lines(b: int):
        return (_entry(b * per + j) for j in range(per))

    def write(name: str, lines) -> None:
        with open(os.path.join(log, name), "w") as f:
            f.write("v1")
            for line in lines:
                f.write("\n")
                f.write(line)

    def upto(b: int):
        return (line for x in range(b + 1) for line in batch_lines(x))

    write(f"{prev_compact}.compact", upto(prev_compact))
    for b in range(prev_compact + 1, latest_compact):
        write(str(b), batch_lines(b))
    write(f"{latest_compact}.compact", upto(latest_compact))
    for b in range(latest_compact + 1, latest_compact + 1 + after):
        write(str(b), batch_lines(b))
    return {"entries": entries, "batches": latest_compact + after + 1, "compacts": [prev_compact, latest_compact]}


NAIVE = r"""
import json, os, sys
log = os.path.join(sys.argv[1], "_spark_metadata")
names = sorted(os.listdir(log), key=lambda n: int(n.split(".")[0]))
latest = max(int(n.split(".")[0]) for n in names if n.endswith(".compact"))
entries = []
for n in names:
    if int(n.split(".")[0]) >= latest:
        with open(os.path.join(log, n)) as f:
            lines = f.read().split("\n")
        entries += [json.loads(line) for line in lines[1:]]
with open(os.path.join(log, f".{latest}.compact.tmp"), "w") as f:
    f.write("v1")
    for e in entries:
        f.write("\n" + json.dumps(e, separators=(",", ":")))
os.replace(os.path.join(log, f".{latest}.compact.tmp"), os.path.join(log, f"{latest}.compact"))
print(len(entries))
"""


def measure(cmd: list[str]) -> tuple[float, float, str]:
    """Wall time and peak RSS (MiB) of a child process, and its stdout."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "w = time.perf_counter() - t; "
            "print(p.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "print(p.stdout); print(p.stderr[-2000:], file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, cwd=ROOT)
    head = res.stdout.splitlines()[0].split()
    if head[0] != "0":
        raise SystemExit(f"{' '.join(cmd)} failed: {res.stderr[-2000:]}")
    return float(head[1]), int(head[2]) / 1024, res.stdout


def run(entries: int, batches: int, work: str) -> dict:
    template = os.path.join(work, f"t{entries}", "out")
    t = time.perf_counter()
    shape = write_log(template, entries, batches)
    gen = time.perf_counter() - t

    def fresh(name: str) -> str:
        d = os.path.join(work, name, "out")
        if os.path.exists(os.path.dirname(d)):
            shutil.rmtree(os.path.dirname(d))
        shutil.copytree(template, d)
        # the query stopped an hour ago (without --checkpoint, a fresh log means a running query)
        for n in os.listdir(os.path.join(d, "_spark_metadata")):
            p = os.path.join(d, "_spark_metadata", n)
            os.utime(p, (time.time() - 3600, time.time() - 3600))
        return d

    out = fresh("ours")
    ours_s, ours_mb, stdout = measure([sys.executable, "-m", "checkpoint_ops.cli", "sink", "compact", out, "--yes",
                                       "--json"])
    result = json.loads(stdout.splitlines()[1]) if stdout.splitlines()[1:] else {}
    out = fresh("naive")
    naive_s, naive_mb, _ = measure([sys.executable, "-c", NAIVE, out])
    start_s, _, _ = measure([sys.executable, "-c", "import checkpoint_ops.cli, checkpoint_ops.sinklog"])
    # entries processed: every entry readers see (the newest compact and the files after it)
    seen = entries + 5 * (entries // batches)
    return {"entries": entries, "shape": shape, "generate_s": gen, "ours_s": ours_s, "ours_mb": ours_mb,
            "start_s": start_s, "rate_after_start": seen / max(1e-9, ours_s - start_s),
            "naive_s": naive_s, "naive_mb": naive_mb, "rate": seen / ours_s, "naive_rate": seen / naive_s,
            "plan": result.get("plan", {}).get("summary") if isinstance(result, dict) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--batches", type=int, default=10_000)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sink-compaction-bench-")
    try:
        rows = [run(n, args.batches, work) for n in args.entries]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"### Sink-log compaction ({args.batches} batches, compact interval 10)\n")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}. Command: `python benchmarks/sink_compaction.py --entries "
          f"{' '.join(map(str, args.entries))} --batches {args.batches}`.\n")
    print("| entries | `sink compact` | entries/s | (after the interpreter's start) | peak RSS "
          "| naive read-all + rewrite | entries/s | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['entries']:,} | {r['ours_s']:.2f} s | {r['rate']:,.0f} | {r['rate_after_start']:,.0f} "
              f"(start {r['start_s']:.2f} s) | {r['ours_mb']:.0f} MiB | "
              f"{r['naive_s']:.2f} s | {r['naive_rate']:,.0f} | {r['naive_mb']:.0f} MiB |")
    print()
    for r in rows:
        print(f"- {r['entries']:,} entries: plan summary {r['plan']}")


if __name__ == "__main__":
    main()
