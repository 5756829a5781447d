"""Write docs/reliability.md from a run of the crash matrix, the bad-input corpus and the fault matrix.

``make reliability`` runs ``tests/test_crash_matrix.py``, ``tests/test_races.py``,
``tests/test_bad_input_corpus.py`` and (with ``CHECKPOINT_OPS_FAULT_MATRIX=long``) ``tests/test_fault_matrix.py``
with ``CHECKPOINT_OPS_MATRIX_OUT`` set (each matrix row is appended there as the tests run; fault rows have
``"kind": "faults"``, race rows ``"kind": "race"``), then this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tests.test_bad_input_corpus import CASES, expected  # noqa: E402

INTRO = """# Reliability

These promises are tested here on checkpoints real Spark wrote (HDFS state store, RocksDB with changelog
checkpointing, RocksDB with checkpoint format V2), and re-checked by `make test` on every change:

1. **No operation leaves a checkpoint Spark cannot restart, whenever it is killed.** The crash matrix runs
   each mutating operation with `CHECKPOINT_OPS_KILL_AT=k` (`checkpoint_ops/storage/killswitch.py`): the
   process is SIGKILLed just before its k-th mutating call through the file manager (each atomic write, its
   checksum sidecar, each file deleted, moved, copied or undeleted), for every k up to the number of calls an
   uninterrupted run makes (`make reliability`, which writes this page; `make test` kills at a fixed sample
   of 18 of them per operation: the first and last five and eight between). After every crash the recovery a user would run (`rollback --resume`, or the same command
   again) must leave the checkpoint and its sinks exactly (byte for byte) as an uninterrupted run does. For
   rollback, Spark then resumes from recovered results at sampled crash points, with exact output.
2. **Bad input gets a clear error, names the file, and changes nothing.** The corpus damages real
   checkpoints one way each and runs every command that reads them.
3. **Two commands started at once: exactly one applies.** Every mutating command takes the lease of every
   root it changes before it reads anything; the race tests start two of them at the same moment, many
   times, and the crash matrix kills one while a second one starts.
4. **A flaky object store never corrupts anything.** Every operation that touches S3 runs through a proxy
   that fails a share of requests or goes down entirely; each completes, or stops cleanly with a message
   naming the command that finishes it, and that command does.

Regenerate with `make reliability` (about {minutes} minutes). This page: written by `tests/reliability_report.py`
from the rows in `{rows}`, at commit {commit}.
"""

FAULTS = """## A flaky object store

Recorded {date} on {machine}, Python {python}. Each operation runs on a checkpoint real Spark wrote
(RocksDB, checkpoint format V2), through `tests/faulty_s3.py`: a loopback proxy in front of the S3 server
that fails the given share of requests (seeded; evenly: connection resets, replies lost after the server
acted, 500 InternalError, 503 SlowDown, slow replies, bodies cut short of their Content-Length), or lets
an operation start and then fails every request for the given time. The retry policy is the default
(`checkpoint_ops/storage/retry.py`: 10 attempts per request, backoff from 0.1 s doubling to 5 s, full
jitter). A run that stops must exit 2 with the storage failure and the command that finishes it, leave
nothing half-visible (the checkpoint fenced or untouched, every published backup whole), and that
command, run as printed once the store answers, must finish it (`tests/fault_runs.py`).

Afterwards: `fsck` passes (rollback, restore, sink compact), `backup verify` passes and the manifest
names exactly the bytes on disk (backup create, prune), undo restores every object byte for byte, and
Spark resumes from the rolled-back and the restored checkpoint with exact output.

| operation | faults | seed | runs to finish | retries reported | faults injected | seconds | Spark resumed exactly |
|---|---|---|---|---|---|---|---|
"""


def fault_lines(rows: list[dict]) -> list[str]:
    """The fault matrix's section: one row per operation, kind of faults and seed."""
    if not rows:
        return []
    lines = [FAULTS.format(date=time.strftime("%Y-%m-%d"), machine=platform.machine(),
                           python=platform.python_version()).rstrip("\n")]
    for r in rows:
        named = any("`checkpoint-ops " in s and "then the same command again" not in s for s in r["stops"])
        runs = "1 (completed in one run)" if r["runs"] == 1 else f"{r['runs']} (stopped {len(r['stops'])}x, finished " \
            f"{'by the command its message named' if named else 'by running it again'})"
        seed = "" if r["seed"] is None else str(r["seed"])
        lines.append(f"| {r['operation']} | {r['faults']} | {seed} | {runs} | {r['retries']} | {r['injected']} | "
                     f"{r.get('seconds', '')} | {'yes' if r['spark_checked'] else ''} |")
    lines.append("""
*retries reported*: the retries the runs' `--json` reported (completed runs: `retries` per store; stopped runs: the
retries of the store that gave up). *faults injected*: counted at the proxy over all the operation's runs (slow
replies delay a request without failing it; during an outage every request fails). *seconds*: from the first run to
the end of the last, waiting out the outage included (a loaded 2-core machine; for orientation, not a benchmark).
*rollback again, after the undo*: the same rollback under the same faults leaves the same bytes as the first.
""")
    lines += stop_lines([r for r in rows if r["stops"]])
    return lines


def stop_lines(rows: list[dict]) -> list[str]:
    """How each run that stopped did so, and what finished it: the exit codes of the runs in order, each
    stop's fix as printed, and the command run next because of it (as the fix named it)."""
    if not rows:
        return []
    lines = ["### The runs that stopped, and what finished them\n",
             "Each operation below stopped at least once (the store kept failing one request through every "
             "attempt). *exits*: the exit code of each run, in order; then, for each stop, the storage failure and the fix it printed, and "
             "what was run next because of it (the command exactly as the fix names it, run once the store "
             "answered; the harness adds `--json`, the storage options and, for `undo`, `--yes`).\n"]
    for r in rows:
        seed = "" if r["seed"] is None else f", seed {r['seed']}"
        exits = r.get("exits")
        lines.append(f"* **{r['operation']}**, {r['faults']}{seed}: exits "
                     f"{' → '.join(map(str, exits)) if exits else 'not recorded'}")
        then_ran, stopped_by = r.get("then_ran") or [], r.get("stopped_by") or []
        for i, fix in enumerate(r["stops"]):
            ran = f"`{then_ran[i]}`" if i < len(then_ran) and then_ran[i].startswith("checkpoint-ops ") else \
                (then_ran[i] if i < len(then_ran) else "not recorded")
            why = f"{stopped_by[i]}; " if i < len(stopped_by) else ""
            lines.append(f"  * stop {i + 1}: {why}fix: “{fix}”; then ran: {ran}")
    lines.append("")
    return lines


RACES = """## Races

Recorded {date} on {machine}, Python {python}. `tests/test_races.py` starts two commands in two warm fork
servers behind one barrier, so both children fork within milliseconds, on a checkpoint real Spark wrote
(HDFS state store; the sink pairs on a stateless query's output; *s3 + local sink*: the checkpoint on the S3
server, where a lease is an `If-None-Match: *` put). Each trial must show: exactly one applies; the other
exits 1, refused by the winner's lease and naming it (owner, host, pid, since when), or, had it started only
after the winner finished, refused for a reason that changes nothing (exit 1, or 2 for a restore into a
target no longer empty); the tree is byte for byte what the
winner alone leaves, with no lease left behind; `history` lists exactly what applied; `fsck` is clean;
`undo` gives back exactly the tree before the race (a restore's undo empties the target again); and in one
trial per pair, instead of the undo, Spark resumes from the raced result with exact output.

| pair | store | trials | exactly one applied | refused by the lease | serialised attempts | converged | Spark resumed exactly |
|---|---|---|---|---|---|---|---|
"""


def race_lines(rows: list[dict]) -> list[str]:
    """The race section: one row per pair and store."""
    if not rows:
        return []
    lines = [RACES.format(date=time.strftime("%Y-%m-%d"), machine=platform.machine(),
                          python=platform.python_version()).rstrip("\n")]
    for r in rows:
        ok = "all" if r["converged"] == r["trials"] else f"**{r['converged']}** (failed: {r['failures'][:3]})"
        one = "all" if r["one_applied"] == r["trials"] else f"**{r['one_applied']}**"
        spark = f"{r['spark_checked']} trial" if r["spark_checked"] else ""
        lines.append(f"| {r['pair']} | {r['store']} | {r['trials']} | {one} | {r['lease_refusals']} | "
                     f"{r['serialised']} | {ok} | {spark} |")
    lines.append("""
*serialised attempts*: attempts not counted as trials, because the second command reached the lease only after
the first had released it (a lease is not a queue; a forked child can take a few hundred milliseconds to get
there on a loaded machine, as long as a whole operation takes): both ran, one after the other, and the result
was checked to be exactly what running them in turn leaves. *sink lease only*: `sink compact` without
`--checkpoint` takes only the sink output's lease, and that lease alone keeps it and the rollback apart.
""")
    return lines


def _commit() -> str:
    """The checked-out commit the rows were recorded at (short hash; marked when the tree has changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", HERE, *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else head


KEPT_SECTIONS = {"## Crash matrix": "crash", "## Races": "race", "## A flaky object store": "faults"}


def _sections(text: str) -> list[tuple[str, str]]:
    """A page cut at its level-2 headings: (heading line, text up to the next one); the text before the
    first heading comes as ("", ...). Joining the texts gives the page back."""
    return [(part.split("\n", 1)[0] if part.startswith("## ") else "", part)
            for part in re.split(r"(?m)^(?=## )", text) if part]


def keep_missing(new: str, old: str, recorded: set[str]) -> str:
    """``new`` with each matrix section whose kind of rows was not ``recorded`` (crash, race, faults) taken
    verbatim from ``old`` (an earlier page: those sections keep their own recording dates and figures)."""
    previous = dict(_sections(old))
    out = []
    for heading, text in _sections(new):
        if heading in KEPT_SECTIONS and KEPT_SECTIONS[heading] not in recorded and heading in previous:
            text = previous.pop(heading)
        out.append(text)
        if heading == "## Crash matrix":  # sections this run has no rows for at all: where they stood
            out += [previous.pop(h) for h in ("## Races", "## A flaky object store")
                    if KEPT_SECTIONS[h] not in recorded and h in previous and h not in dict(_sections(new))]
    return "".join(out)


def main(rows_path: str, out_path: str, keep_from: str | None = None, ran: str | None = None) -> None:
    """Write the page from the rows in ``rows_path``. With ``keep_from`` (an earlier page), a matrix with no
    rows in ``rows_path`` keeps its section from that page instead of losing it. ``ran``: what was run to
    record the rows, when it was not ``make reliability`` (said on the page)."""
    every = [json.loads(line) for line in open(rows_path)] if os.path.exists(rows_path) else []
    rows = [r for r in every if r.get("kind") not in ("faults", "race")]
    recorded = {r.get("kind", "crash") for r in every}
    kept = sorted(h[3:] for h, kind in KEPT_SECTIONS.items() if kind not in recorded) if keep_from else []
    lines = [INTRO.format(minutes=35, rows=os.path.basename(rows_path), commit=_commit())]
    if ran:
        lines.append(f"The rows were recorded by: {ran}\n")
    if kept:
        lines.append(f"That file held no rows for: {', '.join(kept)}; those sections are kept as they were in\n"
                     f"the page before, with their own recording dates.\n")
    lines.append(f"## Crash matrix\n\nRecorded {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
                 f"Python {platform.python_version()}.\n")
    lines.append("| operation | store | crash points | converged | Spark resumed exactly at k |")
    lines.append("|---|---|---|---|---|")
    for r in rows:
        spark = ", ".join(map(str, r["spark_checked"])) if r["spark_checked"] else ""
        ok = "all" if r["converged"] == r["points"] else f"**{r['converged']}** (failed: {r['failures'][:3]})"
        if r.get("total") and r["points"] < r["total"]:
            ok += f" (a sample: {r['points']} of {r['total']} points)"
        lines.append(f"| {r['operation']} | {r['store']} | {r['points']} | {ok} | {spark} |")
    lines.append("""
*local*: checkpoint and sink on local disk (HDFS state store; a rollback across a compaction point).
*s3 + local sink*: the checkpoint on the S3 server (moto over HTTP, unversioned: a move is a copy and a
delete), its file sink on local disk, so one operation spans both stores (a small stateless query, rolled
back one batch: every crash point costs HTTP round trips to the test server).
Undo and prune are crashed from the state an uninterrupted rollback leaves.
*rocksdb v2*: a small windowed count (two batches, one shuffle partition) on RocksDB with checkpoint format
V2 (SST files with unique ids, changelogs, Spark's own CRC32C checksum files), backed up and restored to a new
location with `--relocate`; *then resume* / *then undo*: the same crash points recovered by `resume TARGET`
(the complete restore, byte for byte) or by `undo TARGET` (nothing Spark reads is left in the target); *undo
of a restore*: crashed from a completed restore, finished by running `undo` again; Spark resumes exactly from
a recovered restore with the original moved away.
*raced by ...*: killed at sampled points (k = 2, 6, 10, 16, 30, 45, where it gets that far, and it is the
first to the lease) while a second command starts at the same moment on the same roots: the second is
refused (by the lease, or because the interrupted operation must be finished first) or runs entirely before
or after it, and after the recovery a user would run the tree is what the operation alone leaves, or what
the two leave one after the other.

What the matrix found and what changed because of it:

* a crash while the journal itself was written left a journal directory without `plan.json`, which made
  `--resume` fail; such a directory is now no operation at all (nothing had changed yet);
* a crash between `undo` restoring `metadata` and writing its `undone` marker looked like an applied
  rollback whose files had come back, and `undo` refused to finish; undo now writes an `undoing` marker
  before it changes anything, and running it again finishes it;
* a crash inside an atomic write leaves the writer's hidden temp file; resuming or undoing removes the
  temp files of its own interrupted writes (the fence kept Spark away, so they are ours).
""")
    lines += race_lines([r for r in every if r.get("kind") == "race"])
    lines += fault_lines([r for r in every if r.get("kind") == "faults"])
    lines.append("## Bad-input corpus\n")
    lines.append("Each case damages one real checkpoint of the given flavour; n is the rollback target (two batches "
                 "before the last compaction). *restart*: the damage is in the files Spark reads to restart after "
                 "n; *removed*: in what the rollback removes (a repair: the plan names it, and the result passes "
                 "`fsck --deep` and Spark resumes from it with exact output); *elsewhere*: neither; *refused*: "
                 "nothing is damaged, but the `--sink` is another query's output, and every command that would "
                 "change or judge the two together refuses, naming it. Every command must exit as listed, name the "
                 "file where marked (✓), print no traceback, and leave the tree unchanged (except an applied "
                 "rollback, and the pairing record `ledger sync` may add beside the checkpoint's own sink log).\n")
    cmds = list(expected(CASES[0]))
    lines.append("| case | flavour | where | " + " | ".join(f"`{c}`" for c in cmds) + " |")
    lines.append("|---|---|---|" + "---|" * len(cmds))
    for case in CASES:
        exp = expected(case)
        cells = [f"{code}{' ✓' if named else ''}" for code, named in (exp[c] for c in cmds)]
        lines.append(f"| {case.name} | {case.flavour} | {case.where} | " + " | ".join(cells) + " |")
    lines.append(f"\n{len(CASES)} cases. The permission case runs its commands without root's permission "
                 "override (`setpriv`), since root reads any file.\n")
    text = "\n".join(lines)
    if keep_from:
        text = keep_missing(text, open(keep_from).read(), recorded)
    with open(out_path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write docs/reliability.md from the matrices' rows.")
    parser.add_argument("rows", help="the rows (JSON lines) the matrices appended to CHECKPOINT_OPS_MATRIX_OUT")
    parser.add_argument("out", help="the page to write")
    parser.add_argument("--keep-missing-from", metavar="PAGE",
                        help="an earlier page: a matrix with no rows here keeps its section from it")
    parser.add_argument("--ran", metavar="TEXT", help="what was run to record the rows, when not `make reliability`")
    cli_args = parser.parse_args()
    main(cli_args.rows, cli_args.out, cli_args.keep_missing_from, cli_args.ran)
