"""Runs ``checkpoint-ops`` commands in forked children of one warm interpreter.

The crash matrix runs an operation hundreds of times, killed at each mutating call in turn; a new
interpreter for each run would spend most of the suite importing. This process imports the CLI
once; per request (one JSON line on stdin: args, env, stdout/stderr files) it forks a child that
runs the command, and answers with the child's exit status (negative: killed by that signal) and its pid
and when it was forked and reaped (a lease names its holder's pid, and the race tests tell a race from
two commands that ran one after the other).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

from checkpoint_ops.cli import main
from checkpoint_ops.storage import killswitch

# The modules the commands import when they run, imported here once: a child then reaches its first
# lease within milliseconds of its fork, so two children forked together really race for it.
WARM = ["checkpoint_ops.backup", "checkpoint_ops.backup.restore", "checkpoint_ops.backup.retention",
        "checkpoint_ops.fsck", "checkpoint_ops.inspect", "checkpoint_ops.lease_break", "checkpoint_ops.ledger",
        "checkpoint_ops.prune", "checkpoint_ops.recovery", "checkpoint_ops.rollback", "checkpoint_ops.sinklog",
        # what a command on S3 imports when it opens its file manager (about a second per child otherwise);
        # imports only: no client, session or event loop is made before the fork
        "checkpoint_ops.storage.direct_put", "s3fs", "aiobotocore.session", "aiobotocore.httpsession", "boto3"]
for _name in WARM:
    importlib.import_module(_name)


def serve() -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        forked = time.time()
        pid = os.fork()
        if pid == 0:  # the child: run one command and exit with its code, whatever happens
            code = 70
            try:
                os.environ.update(req.get("env", {}))
                for k in req.get("unset", []):
                    os.environ.pop(k, None)
                for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(f, fd)
                    os.close(f)
                code = main(req["args"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                if req.get("count_to"):  # how many mutating calls the switch counted (it was armed)
                    with open(req["count_to"], "w") as f:
                        f.write(str(killswitch._count["n"] if killswitch._count["pid"] == os.getpid() else 0))
                os._exit(code if isinstance(code, int) else 70)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"code": code, "pid": pid, "forked": forked, "ended": time.time()}), flush=True)


if __name__ == "__main__":
    serve()
