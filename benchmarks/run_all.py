"""Run every benchmark of ``make bench`` in one go and record their reports in ``docs/benchmarks.md``.

Each benchmark prints a markdown report with its figures side by side with its baseline, measured in the
same run. This runs them one after another, in one process each (as ``make bench`` did), and replaces the
section between the markers below in the output file with: when and where they ran (commit, machine,
load average before and after each), each report as printed, and any benchmark that failed (its exit
status and the end of its error output). The rest of the file (the analysis, the at-a-glance table) is
left as it is. Exit status: non-zero if any benchmark failed.

Usage: ``python benchmarks/run_all.py [--out docs/benchmarks.md] [--only NAME,...]``
"""

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BEGIN = "<!-- make bench: begin (written by benchmarks/run_all.py; edits here are replaced) -->"
END = "<!-- make bench: end -->"

# (name, arguments): the order and settings ``make bench`` has always used
BENCHMARKS = [
    ("rollback", ["benchmarks/rollback.py"]),
    ("sink_compaction", ["benchmarks/sink_compaction.py"]),
    ("backup", ["benchmarks/backup.py"]),
    ("check_pass", ["benchmarks/check_pass.py", "--sizes", "10,1000,10000"]),
    ("asset_overhead", ["benchmarks/asset_overhead.py", "--sizes", "10,1000,10000"]),
    ("pass_requests", ["benchmarks/pass_requests.py", "--sizes", "1000,2000"]),
    ("memory", ["benchmarks/memory.py", "--batches", "500000"]),
    ("compact_memory", ["benchmarks/compact_memory.py", "--batches", "10000"]),
    ("s3_load", ["benchmarks/s3_load.py", "--batches", "100000", "--partitions", "1000"]),
]


@dataclass(frozen=True)
class Outcome:
    name: str
    command: str
    exit_code: int
    report: str
    error_tail: str
    wall_s: float
    load_before: float
    load_after: float


def run_one(name: str, args: list[str]) -> Outcome:
    command = " ".join(["python", *args])
    print(f"[bench] {name}: {command}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    wall = time.monotonic() - started
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) if proc.returncode else ""
    print(f"[bench] {name}: exit {proc.returncode} after {wall:.0f} s", file=sys.stderr, flush=True)
    return Outcome(name, command, proc.returncode, proc.stdout.strip(), tail, wall, load_before,
                   os.getloadavg()[0])


def section(outcomes: list[Outcome], commit: str, started: str, planned: int | None = None) -> str:
    partial = f"; {len(outcomes)} of {planned} benchmarks so far" if planned and len(outcomes) < planned else ""
    lines = [BEGIN, "",
             f"## `make bench`, one run ({started}, commit {commit}{partial})", "",
             f"Every benchmark of `make bench` in one run ({platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}), one after another; each report below is exactly what the "
             "benchmark printed, each figure beside its baseline from the same run. The analysis of each "
             "figure against its target is in the sections above.", "",
             "| benchmark | exit | wall, s | load average before → after |", "|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| `{o.command}` | {o.exit_code} | {o.wall_s:.0f} | {o.load_before:.1f} → {o.load_after:.1f} |")
    for o in outcomes:
        lines += ["", f"### {o.name}", ""]
        if o.exit_code:
            lines += [f"**Failed** (exit {o.exit_code}); the end of its error output:", "", "```",
                      o.error_tail, "```"]
        lines.append(o.report or "(no report printed)")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def record(path: str, text: str) -> None:
    """Replace the marked section of ``path`` with ``text`` (appended when the file has none)."""
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + text.rstrip("\n") + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument("--only", help="comma-separated benchmark names (default: all): " +
                    ", ".join(name for name, _ in BENCHMARKS))
    args = ap.parse_args(argv)
    chosen = BENCHMARKS
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {name for name, _ in BENCHMARKS})
        if unknown:
            ap.error(f"unknown benchmark(s) {unknown}; known: {[name for name, _ in BENCHMARKS]}")
        chosen = [b for b in BENCHMARKS if b[0] in wanted]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                      text=True).stdout.strip():
        commit += " with uncommitted changes"
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    outcomes: list[Outcome] = []
    for name, cmd in chosen:  # recorded after each: an interrupted run keeps the reports it finished
        outcomes.append(run_one(name, cmd))
        record(args.out, section(outcomes, commit, started, len(chosen)))
    print(f"[bench] recorded in {args.out}", file=sys.stderr)
    return 1 if any(o.exit_code for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
