"""The crash matrix: run an operation killed at its 1st, 2nd, ... mutating call until it finishes.

``storage/killswitch.py`` kills the process (SIGKILL) just before its k-th mutating call through
the file manager. After each crash a recovery command (``rollback --resume``, or the same command
again) must leave the tree exactly as an uninterrupted run does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from tests.helpers import is_own_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class ForkRunner:
    """``checkpoint-ops`` in forked children of one warm interpreter (tests/fork_server.py)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fork_server.py")], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        assert self.proc.stdout.readline().strip() == "ready"
        self.dir = tempfile.mkdtemp(prefix="fork-runner-")

    def run(self, *args, kill_at: int | None = None, env: dict | None = None) -> tuple[int, str, str]:
        out, err = os.path.join(self.dir, "out"), os.path.join(self.dir, "err")
        env = {**{k: v for k, v in os.environ.items() if k.startswith("AWS_")}, **(env or {})}
        unset = []
        if kill_at is None:
            unset.append("CHECKPOINT_OPS_KILL_AT")
        else:
            env["CHECKPOINT_OPS_KILL_AT"] = str(kill_at)
        req = {"args": [str(a) for a in args], "env": env, "unset": unset, "stdout": out, "stderr": err}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        code = json.loads(self.proc.stdout.readline())["code"]
        return code, open(out).read(), open(err).read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def tree_digest(*roots: str) -> dict[str, str]:
    """rel path (per root) -> sha256 of content, for every file Spark reads under the roots (checkpoint-ops'
    own records beside them are left out: a sink's pairing record names the operation that wrote it)."""
    out = {}
    for i, root in enumerate(roots):
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                if is_own_file(p):
                    continue
                out[f"{i}:{os.path.relpath(p, root)}"] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@dataclass
class MatrixRow:
    """One operation on one store: how many crash points, and whether each converged."""

    operation: str
    store: str
    points: int = 0
    converged: int = 0
    spark_checked: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"operation": self.operation, "store": self.store, "points": self.points,
                "converged": self.converged, "spark_checked": self.spark_checked, "failures": self.failures}


def record(row: MatrixRow) -> None:
    """Append the row to the report docs/reliability.md is written from (CHECKPOINT_OPS_MATRIX_OUT)."""
    path = os.environ.get("CHECKPOINT_OPS_MATRIX_OUT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row.to_dict()) + "\n")
