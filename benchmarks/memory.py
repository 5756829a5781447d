"""Benchmark: peak memory of the read paths over a long batch ledger.

A synthetic checkpoint (``benchmarks/synthetic.py``: Spark's real names and formats, HDFS state, a file
source log) retaining ``--retain`` batches of ``--batches`` run, and beside it a batch ledger recording
every one of the ``--batches`` batches (the records ``ledger sync`` writes: raw ``offsets/N`` and
``commits/N``, source offsets, state version), in ``--segments`` segments as years of syncs and merges
leave them. Each command runs in a child process, measured by its own peak RSS (``wait4``), CPU time
and wall time, side by side with the same command on the same checkpoint without a ledger (what the
ledger costs) and with the interpreter importing our package only:

* ``checkpoint-ops inspect``; ``fsck``; ``ledger sync`` (which indexes the ledger to see what is new);
  ``rollback --to-batch <latest - 50> --dry-run`` (planning).

Target: every command under 256 MB peak RSS with 500,000 ledgered batches.

Usage: ``python benchmarks/memory.py [--batches 500000] [--retain 100] [--partitions 20] [--dir D]``
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
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import synthetic  # noqa: E402

TARGET_MB = 256
CLI = [sys.executable, "-m", "checkpoint_ops.cli"]


def write_ledger(ledger_dir: str, batches: int, partitions: int, segments: int) -> int:
    """Segments holding a record for every batch, as ``ledger sync`` writes them (streamed to disk)."""
    os.makedirs(ledger_dir, exist_ok=True)
    conf = dict(synthetic.CONF, **{"spark.sql.shuffle.partitions": str(partitions)})
    t0 = 1_790_000_000_000
    per = -(-batches // segments)
    total = 0
    for s in range(segments):
        lo, hi = s * per, min(batches, (s + 1) * per)
        if lo >= hi:
            break
        name = f"2026{s:010d}-merged-{s:08x}.jsonl"
        with open(os.path.join(ledger_dir, name), "w") as f:
            for b in range(lo, hi):
                meta = {"batchWatermarkMs": 0, "batchTimestampMs": t0 + b * 1000, "conf": conf}
                offsets = f"v1\n{json.dumps(meta, separators=(',', ':'))}\n{{\"logOffset\":{b}}}"
                rec = {"batch": b, "offsets": offsets, "timestamp_ms": t0 + b * 1000, "watermark_ms": 0,
                       "source_offsets": {"0": {"logOffset": b}}, "commits": 'v1\n{"nextBatchWatermarkMs":0}',
                       "state": {"version": b + 1, "unique_ids": None}}
                if b > lo:
                    f.write("\n")
                f.write(json.dumps(rec, separators=(",", ":")))
        total += os.path.getsize(os.path.join(ledger_dir, name))
    return total


# The child reports its own high-water mark (VmHWM) as it exits: a forked child's ru_maxrss would
# count the parent's memory it was forked from. ``python -c HWM_WRAPPER MODULE ARGS`` runs ``python -m MODULE ARGS``.
HWM_WRAPPER = ("import atexit, runpy, sys\n"
        "def _hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            sys.stderr.write('\\nVMHWM ' + line.split()[1] + '\\n')\n"
        "atexit.register(_hwm)\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def measure(argv: list[str]) -> dict:
    """Run a child (``python -m MODULE ARGS`` or ``python -c CODE``); its own peak RSS (MiB), CPU seconds,
    wall seconds and exit code."""
    if argv[1] == "-m":
        argv = [argv[0], "-c", HWM_WRAPPER, *argv[2:]]
    else:
        argv = [argv[0], "-c", argv[2] + "\n" + HWM_WRAPPER.replace("runpy.run_module(sys.argv[0], run_name='__main__', "
                                                               "alter_sys=True)\n", ""), "x"]
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    hwm = [int(x.split()[1]) for x in err.splitlines() if x.startswith("VMHWM ")]
    return {"rss_mb": (hwm[-1] if hwm else ru.ru_maxrss) / 1024, "cpu_s": ru.ru_utime + ru.ru_stime,
            "wall_s": wall, "code": p.returncode, "stderr": err[-400:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=500_000)
    ap.add_argument("--retain", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=20)
    ap.add_argument("--segments", type=int, default=9)
    ap.add_argument("--dir")
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="memory-bench-")
    ckpt = os.path.join(work, "queries", "events")
    try:
        t = time.perf_counter()
        ledger_dir = os.path.join(work, "queries", ".checkpoint-ops", "events", "ledger")
        if os.path.exists(ckpt):  # a --dir kept from an earlier run of the same shape: start clean
            shutil.rmtree(os.path.join(work, "queries"))
        synthetic.write_local(ckpt, batches=args.batches, partitions=args.partitions, retain_state=args.retain,
                              retain_log=args.retain, retain_offsets=args.retain)
        for name in ("schema", ".schema.crc"):  # the synthetic one is a placeholder (and its sidecar, or fsck
            os.remove(os.path.join(ckpt, "state/0/0/_metadata", name))  # warns of a sidecar without its file)
        size = write_ledger(ledger_dir, args.batches, args.partitions, args.segments)
        print(f"built in {time.perf_counter() - t:.0f} s: ledger of {args.batches:,} batches, "
              f"{size / 2**20:.0f} MiB in {args.segments} segments", file=sys.stderr, flush=True)
        target = args.batches - 50
        commands = {
            "inspect": ["inspect", ckpt, "--json"],
            "fsck": ["fsck", ckpt, "--json"],
            "ledger sync": ["ledger", "sync", ckpt, "--json"],
            "rollback planning (--dry-run)": ["rollback", ckpt, "--to-batch", str(target), "--dry-run", "--json"],
        }
        imports = measure([sys.executable, "-c", "import checkpoint_ops.cli"])
        rows = []
        for name, cmd in commands.items():
            hidden = ledger_dir + ".away"
            os.rename(ledger_dir, hidden)
            try:
                without = measure(CLI + cmd)
            finally:
                shutil.rmtree(ledger_dir, ignore_errors=True)  # what `ledger sync` started without one
                os.rename(hidden, ledger_dir)
            with_ledger = measure(CLI + cmd)
            rows.append((name, with_ledger, without, os.getloadavg()[0]))
            print(f"{name}: {with_ledger['rss_mb']:.0f} MiB (without a ledger {without['rss_mb']:.0f} MiB), "
                  f"exit {with_ledger['code']}", file=sys.stderr, flush=True)
            if with_ledger["code"] not in (0, 1):
                print(with_ledger["stderr"], file=sys.stderr)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    print(f"`python benchmarks/memory.py --batches {args.batches} --retain {args.retain} --partitions "
          f"{args.partitions} --segments {args.segments}` ({platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}); the interpreter importing the CLI alone: {imports['rss_mb']:.0f} MiB.\n")
    print(f"| command | peak RSS with {args.batches:,} ledgered batches | CPU s | wall s | exit | peak RSS "
          f"without a ledger | CPU s | target ≤ {TARGET_MB} MB | load average |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, w, wo, load in rows:
        met = "met" if w["rss_mb"] * 2**20 <= TARGET_MB * 10**6 else "not met"
        print(f"| `{name}` | {w['rss_mb']:.0f} MiB | {w['cpu_s']:.1f} | {w['wall_s']:.1f} | {w['code']} "
              f"| {wo['rss_mb']:.0f} MiB | {wo['cpu_s']:.1f} | {met} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
