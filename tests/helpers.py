"""Small test helpers: snapshots of a directory tree, and running the CLI."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import socket
import threading

from checkpoint_ops.cli import main


def tree_snapshot(*roots: str) -> dict[str, tuple[str, int]]:
    """path -> (sha256, mtime_ns) for every file under the roots (to prove nothing changed)."""
    out = {}
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                p = os.path.join(dirpath, name)
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[p] = (digest, os.stat(p).st_mtime_ns)
    return out


def is_own_file(path: str) -> bool:
    """A record checkpoint-ops keeps beside Spark's files (the lease, its takeover claim, the sink's pairing
    record, or their Hadoop .crc): not part of what Spark wrote, and it outlives an undo."""
    return os.path.basename(path).lstrip(".").startswith("checkpoint-ops.")


def content_snapshot(*roots: str) -> dict[str, str]:
    """path -> sha256 of every file Spark reads under the roots (checkpoint-ops' own records left out)."""
    return {p: digest for p, (digest, _mtime) in tree_snapshot(*roots).items() if not is_own_file(p)}


def is_lease_file(path: str) -> bool:
    """A lease (or its takeover claim, or their Hadoop .crc) that checkpoint-ops keeps in a root it guards."""
    name = os.path.basename(path)
    return name.startswith(".checkpoint-ops.lease") or name.startswith("..checkpoint-ops.lease")


def cli(*args: str) -> tuple[int, str, str]:
    """Run ``checkpoint-ops`` in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse rejected the arguments
            code = e.code
    return code, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> tuple[int, dict]:
    code, out, err = cli(*args, "--json")
    try:
        return code, json.loads(out)
    except ValueError:
        raise AssertionError(f"not JSON (exit {code}):\n{out}\n{err}") from None


def race_create_atomic(managers, target: str) -> list[str]:
    """Writers on ``managers`` (one each) open ``create_atomic(target)`` and publish at the same
    moment; returns "won"/"lost" per writer. Writer i writes b"writer i"."""
    n = len(managers)
    barrier = threading.Barrier(n)
    results = [None] * n

    def writer(i):
        try:
            w = managers[i].create_atomic(target)  # every writer passes the early existence check...
            w.write(f"writer {i}".encode())
            barrier.wait()  # ...and they publish together
            w.close()
            results[i] = "won"
        except FileExistsError:
            results[i] = "lost"

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sigint_as_ctrl_c() -> None:
    """For a child process (``preexec_fn``): SIGINT back to its default, so Python turns it into KeyboardInterrupt
    as at a terminal. A suite started in the background (``make test &``, nohup) passes SIGINT on ignored, and a
    test that sends Ctrl-C would then test nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def answer_at_prompt(args: list[str], keys: bytes, timeout_s: float = 120) -> tuple[int, str]:
    """``checkpoint-ops ARGS`` on a terminal of its own (a pty): once it asks ``[y/N]``, type ``keys`` (b"\\x03" is
    Ctrl-C, b"\\x04" Ctrl-D). Returns its exit code and everything it wrote."""
    import pty
    import select
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on a terminal
        os.chdir(root)
        sigint_as_ctrl_c()
        os.execv(sys.executable, [sys.executable, "-m", "checkpoint_ops.cli", *map(str, args)])
    said, deadline = b"", time.monotonic() + timeout_s
    while b"[y/N]" not in said:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, said.decode(errors="replace")[-3000:]
        said += os.read(fd, 65536)
    os.write(fd, keys)
    # A Ctrl-C typed just as the prompt appears can reach readline before it reads the terminal, and the CLI then
    # waits at its prompt for good (seen under load): typed again while nothing but its echo came back, as a person
    # would. Never waits past the deadline: the child is killed and the test fails with what it wrote.
    typed_at, quiet_since = len(said), time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise AssertionError("no answer to the keys typed at the prompt:\n" + said.decode(errors="replace")[-3000:])
            at_prompt = said[typed_at:].replace(b"^C", b"").strip() == b""
            if keys == b"\x03" and at_prompt and time.monotonic() - quiet_since > 5:
                os.write(fd, keys)
                quiet_since = time.monotonic()
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        said += chunk
        quiet_since = time.monotonic()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said.decode(errors="replace")
