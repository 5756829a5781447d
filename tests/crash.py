"""The crash matrix: run an operation killed at its 1st, 2nd, ... mutating call until it finishes.

``storage/killswitch.py`` kills the process (SIGKILL) just before its k-th mutating call through
the file manager. After each crash a recovery command (``rollback --resume``, or the same command
again) must leave the tree exactly as an uninterrupted run does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class ForkRunner:
    """``checkpoint-ops`` in forked children of one warm interpreter (tests/fork_server.py)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fork_server.py")], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        assert self.proc.stdout.readline().strip() == "ready"
        self.dir = tempfile.mkdtemp(prefix="fork-runner-")
        self.last: dict = {}  # the last command's child: pid, and when it was forked and reaped (epoch s)

    def run(self, *args, kill_at: int | None = None, env: dict | None = None,
            trace: bool = False) -> tuple[int, str, str]:
        """Run one command; with ``kill_at`` the switch is armed, and ``self.mutations`` is then how many
        mutating calls it counted (all of them, when the command finished unkilled)."""
        out, err = os.path.join(self.dir, "out"), os.path.join(self.dir, "err")
        count = os.path.join(self.dir, "count")
        if os.path.exists(count):
            os.remove(count)
        trace = os.path.join(self.dir, "trace") if trace else None
        if trace and os.path.exists(trace):
            os.remove(trace)
        env = {**{k: v for k, v in os.environ.items() if k.startswith("AWS_")}, **(env or {})}
        if trace:
            env["CHECKPOINT_OPS_KILL_TRACE"] = trace
        unset = [] if trace else ["CHECKPOINT_OPS_KILL_TRACE"]
        if kill_at is None:
            unset.append("CHECKPOINT_OPS_KILL_AT")
        else:
            env["CHECKPOINT_OPS_KILL_AT"] = str(kill_at)
        req = {"args": [str(a) for a in args], "env": env, "unset": unset, "stdout": out, "stderr": err,
               "count_to": count if kill_at is not None else None}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        self.last = answer
        self.mutations = int(open(count).read()) if kill_at is not None and answer["code"] != -9 else None
        self.steps = []  # (k, path) of each mutating call, when ``trace`` was asked for
        if trace and os.path.exists(trace):
            self.steps = [(int(k), path) for k, _, path in (line.rstrip("\n").partition("\t")
                                                            for line in open(trace))]
        return answer["code"], open(out).read(), open(err).read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@dataclass(frozen=True)
class Finished:
    """One command of a race: its exit code (negative: killed by that signal), output, and the pid it ran as."""

    code: int
    out: str
    err: str
    pid: int
    forked: float  # when its child was forked, and reaped (epoch seconds, as the fork server saw them)
    ended: float

    @property
    def error(self) -> dict:
        """The ``--json`` error record of a refused command ({} if it printed none)."""
        try:
            doc = json.loads(self.out)
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) and "problem" in doc else {}

    @property
    def applied(self) -> bool:
        """Exit 0 with an applied result (a plan with nothing to do exits 0 too, applying nothing)."""
        if self.code != 0:
            return False
        try:
            return json.loads(self.out).get("result") is not None
        except ValueError:
            return False


def race(runners: list[ForkRunner], commands: list[list], kill_at: list[int | None] | None = None) -> list[Finished]:
    """Start ``commands[i]`` on ``runners[i]`` at the same moment (the threads that send them wait at one
    barrier, so the forked children start within milliseconds of each other) and wait for all of them.
    ``kill_at[i]``: SIGKILL command i before its k-th mutating call."""
    kill_at = kill_at or [None] * len(commands)
    barrier = threading.Barrier(len(commands))
    results: list[Finished | None] = [None] * len(commands)

    def go(i: int) -> None:
        barrier.wait()
        code, out, err = runners[i].run(*commands[i], kill_at=kill_at[i])
        last = runners[i].last
        results[i] = Finished(code, out, err, last["pid"], last["forked"], last["ended"])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(commands))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


PAIRING_RECORD = "checkpoint-ops.pairing."  # beside a sink log: names the operation that wrote it (its op id)


def tree_digest(*roots: str) -> dict[str, str]:
    """rel path (per root) -> sha256 of content, for every file under the roots but the sink's pairing record
    and its .crc (it names the operation that wrote it, so no two runs write the same bytes; leases stay in:
    none may be left behind)."""
    out = {}
    for i, root in enumerate(roots):
        for d, _, names in os.walk(root):
            for n in names:
                if n.lstrip(".").startswith(PAIRING_RECORD):
                    continue
                p = os.path.join(d, n)
                out[f"{i}:{os.path.relpath(p, root)}"] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


FULL_MATRIX_ENV = "CHECKPOINT_OPS_CRASH_MATRIX"  # "full" (make reliability): every point; else a sample
NEVER = 10 ** 9  # a kill point no command reaches: the switch armed (batches run file by file), counting
EDGE, MIDDLE = 5, 8
_METADATA = re.compile(r"/\.?metadata(?:[.][^/\s]*)?(?:\s|$)")  # a checkpoint's metadata (its temp, its .crc)


def kill_points(total: int, steps: list[tuple[int, str]] = ()) -> list[int]:
    """The crash points to try for a command that makes ``total`` mutating calls: all of them under
    ``make reliability``; in ``make test``, the first and last ``EDGE``, about ``MIDDLE`` spread evenly over
    the changes between, and each step where recovery changes course, with the calls either side: every write of
    a journal file (the plan, its markers) and of ``metadata`` (the fence, the unfence), from ``steps`` ((k, path)
    of each call, ``CHECKPOINT_OPS_KILL_TRACE``). The sample is the same every run, so a failure reproduces."""
    if os.environ.get(FULL_MATRIX_ENV) == "full" or total <= 2 * EDGE + MIDDLE:
        return list(range(1, total + 1))
    inner = range(EDGE + 1, total - EDGE + 1)
    step = len(inner) / MIDDLE
    middle = {inner[int(i * step + step / 2)] for i in range(MIDDLE)}
    turns = {k + d for k, what in steps for d in (-1, 0, 1) if "/journal/" in what or _METADATA.search(what)}
    return sorted({k for k in set(range(1, EDGE + 1)) | middle | turns | set(range(total - EDGE + 1, total + 1))
                   if 1 <= k <= total})


@dataclass
class MatrixRow:
    """One operation on one store: how many crash points, and whether each converged."""

    operation: str
    store: str
    points: int = 0
    converged: int = 0
    spark_checked: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    tried: list[int] = field(default_factory=list)  # the crash points killed at (all, or a sample of them)
    total: int = 0  # the mutating calls of an uninterrupted run

    def to_dict(self) -> dict:
        return {"operation": self.operation, "store": self.store, "points": self.points, "total": self.total,
                "converged": self.converged, "spark_checked": self.spark_checked, "failures": self.failures}


@dataclass
class RaceRow:
    """One pair of operations started together, on one store: per trial, did exactly one apply (the other
    refused, changing nothing), and did the result converge (history, fsck, undo or Spark exact)."""

    pair: str
    store: str
    trials: int = 0
    one_applied: int = 0
    lease_refusals: int = 0  # the loser was refused by the winner's lease (the rest: it started after the winner)
    serialised: int = 0  # attempts not counted as trials: the second reached the lease only after the first had
    # released it, so both ran, one after the other (checked to leave exactly what running them in turn leaves)
    converged: int = 0
    spark_checked: int = 0  # trials whose raced result Spark resumed from, exactly
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"kind": "race", "pair": self.pair, "store": self.store, "trials": self.trials,
                "one_applied": self.one_applied, "lease_refusals": self.lease_refusals, "serialised": self.serialised,
                "converged": self.converged,
                "spark_checked": self.spark_checked, "failures": self.failures}


def record(row: "MatrixRow | RaceRow") -> None:
    """Append the row to the report docs/reliability.md is written from (CHECKPOINT_OPS_MATRIX_OUT)."""
    path = os.environ.get("CHECKPOINT_OPS_MATRIX_OUT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row.to_dict()) + "\n")
