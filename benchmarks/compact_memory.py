"""Benchmark: peak memory of the read paths where a log keeps every compact file.

A compact file holds every entry of its log so far, so where Spark keeps them all (log deletion off:
``spark.sql.streaming.fileSink.log.deletion=false``, or many compactions within ``cleanupDelay``) their entries
together grow with the square of the batches. ``benchmarks/check_pass.py``'s checkpoint and file sink (a compact
file every 10 batches in the source log and the sink log, each kept) at ``--batches`` retained batches: each
command runs in a child process, measured by its own peak RSS (``wait4``), CPU and wall time, side by side with
the same command on the same checkpoint with only the newest compact file of each log kept (what Spark leaves
with deletion on), in the same run:

* the first check pass a materialization runs (``run_check_pass``: inspect and fsck sharing one read);
* ``checkpoint-ops inspect`` and ``checkpoint-ops fsck``.

Target: every command under 256 MB peak RSS (issue 15 item 2's bound), whichever compact files are kept.

Usage: ``python benchmarks/compact_memory.py [--batches 10000] [--dir D]``
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.check_pass import INTERVAL, Stream  # noqa: E402
from benchmarks.memory import TARGET_MB, measure  # noqa: E402

FIRST_PASS = """
from checkpoint_ops.check_pass import run_check_pass
from checkpoint_ops.model.checkpoint import Checkpoint, open_sink
run_check_pass(Checkpoint.open({ckpt!r}), [open_sink({out!r})], batches=False)
"""


def only_newest_compacts(src: str, dst: str) -> None:
    """A copy of the query's tree with every compact file but the newest of each log deleted, and the plain
    files before it (what Spark's ``deleteExpiredLog`` leaves)."""
    shutil.copytree(src, dst)
    for log in ("ckpt/sources/0", "out/_spark_metadata"):
        d = os.path.join(dst, log)
        compacts = sorted(int(n.split(".")[0]) for n in os.listdir(d) if n.endswith(".compact"))
        if not compacts:
            continue
        for n in os.listdir(d):
            stem = n.split(".")[0]
            if stem.isdigit() and int(stem) < compacts[-1]:
                os.remove(os.path.join(d, n))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="compact-memory-")
    kept = os.path.join(work, "kept")
    if not os.path.exists(os.path.join(kept, "q", "ckpt", "offsets", str(args.batches - 1))):
        shutil.rmtree(kept, ignore_errors=True)
        stream = Stream(kept, args.batches)
        for _ in range(args.batches):
            stream.batch()
    newest = os.path.join(work, "newest")
    shutil.rmtree(newest, ignore_errors=True)
    only_newest_compacts(os.path.join(kept, "q"), os.path.join(newest, "q"))
    intervals = ["--source-compact-interval", str(INTERVAL), "--sink-compact-interval", str(INTERVAL)]
    rows = []
    for label, root in (("every compact file kept", kept), ("newest compact file only (baseline)", newest)):
        ckpt, out = os.path.join(root, "q", "ckpt"), os.path.join(root, "q", "out")
        for name, argv in (
            ("first check pass", [sys.executable, "-c", FIRST_PASS.format(ckpt=ckpt, out=out)]),
            ("inspect", [sys.executable, "-m", "checkpoint_ops.cli", "inspect", ckpt, "--sink", out, *intervals]),
            ("fsck", [sys.executable, "-m", "checkpoint_ops.cli", "fsck", ckpt, "--sink", out, *intervals]),
        ):
            shutil.rmtree(os.path.join(root, "q", ".checkpoint-ops"), ignore_errors=True)  # cold: no verdict cache
            m = measure(argv)
            if m["code"] not in ((0,) if name == "first check pass" else (0, 1)):  # fsck: 1 with findings
                print(f"{name} on {label} failed (exit {m['code']}): {m['stderr']}", file=sys.stderr)
                return 1
            rows.append((label, name, m))
    print(f"### Peak memory where every compact file is kept ({args.batches:,} retained batches)\n")
    print(f"Python {platform.python_version()}, {platform.machine()}; compact interval {INTERVAL}; "
          f"target: under {TARGET_MB} MB peak RSS.\n")
    print("| layout | command | peak RSS | CPU | wall | target |")
    print("|---|---|---:|---:|---:|---|")
    met = True
    for label, name, m in rows:
        ok = m["rss_mb"] < TARGET_MB
        met = met and ok
        print(f"| {label} | {name} | {m['rss_mb']:.0f} MB | {m['cpu_s']:.1f} s | {m['wall_s']:.1f} s | "
              f"{'met' if ok else '**not met**'} |")
    print(f"\nEvery command under {TARGET_MB} MB: **{'met' if met else 'not met'}**.")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
