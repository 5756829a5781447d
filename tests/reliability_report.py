"""Write docs/reliability.md from a run of the crash matrix, the bad-input corpus and the fault matrix.

``make reliability`` runs ``tests/test_crash_matrix.py``, ``tests/test_bad_input_corpus.py`` and (with
``CHECKPOINT_OPS_FAULT_MATRIX=long``) ``tests/test_fault_matrix.py`` with ``CHECKPOINT_OPS_MATRIX_OUT`` set
(each matrix row is appended there as the tests run; fault rows have ``"kind": "faults"``), then this script.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tests.test_bad_input_corpus import CASES, expected  # noqa: E402

INTRO = """# Reliability

Two promises are tested here on checkpoints real Spark wrote (HDFS state store, RocksDB with changelog
checkpointing, RocksDB with checkpoint format V2), and re-checked by `make test` on every change:

1. **No operation leaves a checkpoint Spark cannot restart, whenever it is killed.** The crash matrix runs
   each mutating operation with `CHECKPOINT_OPS_KILL_AT=k` (`checkpoint_ops/storage/killswitch.py`): the
   process is SIGKILLed just before its k-th mutating call through the file manager (each atomic write, its
   checksum sidecar, each file deleted, moved, copied or undeleted), for k = 1, 2, ... until a run finishes
   unkilled. After every crash the recovery a user would run (`rollback --resume`, or the same command
   again) must leave the checkpoint and its sinks exactly (byte for byte) as an uninterrupted run does. For
   rollback, Spark then resumes from recovered results at sampled crash points, with exact output.
2. **Bad input gets a clear error, names the file, and changes nothing.** The corpus damages real
   checkpoints one way each and runs every command that reads them.
3. **A flaky object store never corrupts anything.** Every operation that touches S3 runs through a proxy
   that fails a share of requests or goes down entirely; each completes, or stops cleanly with a message
   naming the command that finishes it, and that command does.

Regenerate with `make reliability` (about {minutes} minutes).
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
    return lines


def main(rows_path: str, out_path: str) -> None:
    every = [json.loads(line) for line in open(rows_path)] if os.path.exists(rows_path) else []
    rows = [r for r in every if r.get("kind") != "faults"]
    lines = [INTRO.format(minutes=35)]
    lines.append(f"## Crash matrix\n\nRecorded {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
                 f"Python {platform.python_version()}.\n")
    lines.append("| operation | store | crash points | converged | Spark resumed exactly at k |")
    lines.append("|---|---|---|---|---|")
    for r in rows:
        spark = ", ".join(map(str, r["spark_checked"])) if r["spark_checked"] else ""
        ok = "all" if r["converged"] == r["points"] else f"**{r['converged']}** (failed: {r['failures'][:3]})"
        lines.append(f"| {r['operation']} | {r['store']} | {r['points']} | {ok} | {spark} |")
    lines.append("""
*local*: checkpoint and sink on local disk (HDFS state store; a rollback across a compaction point).
*s3 + local sink*: the checkpoint on the S3 server (moto over HTTP, unversioned: a move is a copy and a
delete), its file sink on local disk, so one operation spans both stores (a small stateless query, rolled
back one batch: every crash point costs HTTP round trips to the test server).
Undo and prune are crashed from the state an uninterrupted rollback leaves.

What the matrix found and what changed because of it:

* a crash while the journal itself was written left a journal directory without `plan.json`, which made
  `--resume` fail; such a directory is now no operation at all (nothing had changed yet);
* a crash between `undo` restoring `metadata` and writing its `undone` marker looked like an applied
  rollback whose files had come back, and `undo` refused to finish; undo now writes an `undoing` marker
  before it changes anything, and running it again finishes it;
* a crash inside an atomic write leaves the writer's hidden temp file; resuming or undoing removes the
  temp files of its own interrupted writes (the fence kept Spark away, so they are ours).
""")
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
    with open(out_path, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
