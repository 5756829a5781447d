"""A test-only crash switch: ``CHECKPOINT_OPS_KILL_AT=k`` kills the process at its k-th mutating call.

Every change any operation makes goes through a file manager, so counting there covers them all:
each published atomic write, each file created in place (``write_many_direct``: counted once its name
exists and before its bytes are written, so a crash can leave it empty under its name), each file
deleted, moved, copied or undeleted, each upload aborted (batch
calls count file by file and, while the switch is armed, run file by file so a crash can land between
any two), and each chunk a multipart upload sends (so a crash can leave one half done, as a dying
writer does). The process is killed with SIGKILL *before* call k takes effect: no ``finally`` block,
no flush, as when a machine dies. The crash-matrix tests run an operation with k = 1, 2, ... until it
finishes without being killed. ``CHECKPOINT_OPS_KILL_SIGNAL=INT`` sends a SIGINT at call k instead (once),
as a person's Ctrl-C: the process handles it as it would that.

Unset (the normal case) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import functools
import os
import signal

KILL_ENV = "CHECKPOINT_OPS_KILL_AT"
# "INT": at call k send SIGINT instead (once), as a person's Ctrl-C: the process handles it as it would
SIGNAL_ENV = "CHECKPOINT_OPS_KILL_SIGNAL"
TRACE_ENV = "CHECKPOINT_OPS_KILL_TRACE"  # while armed: append "k<TAB>path" per mutating call to this file

_count = {"pid": None, "n": 0}


def armed() -> bool:
    return KILL_ENV in os.environ


def tick(n: int = 1, what: str = "") -> None:
    """One mutating call is about to happen (``what``: the path it changes, for ``TRACE_ENV``)."""
    at = os.environ.get(KILL_ENV)
    if at is None:
        return
    if _count["pid"] != os.getpid():  # a forked child counts from zero
        _count["pid"], _count["n"] = os.getpid(), 0
    trace = os.environ.get(TRACE_ENV)
    for _ in range(n):
        _count["n"] += 1
        if trace:
            with open(trace, "a") as f:
                f.write(f"{_count['n']}\t{what}\n")
        how = os.environ.get(SIGNAL_ENV, "KILL")
        if how not in ("KILL", "INT"):
            raise ValueError(f"{SIGNAL_ENV}={how!r}: KILL (the default) or INT")
        if how == "INT":
            if _count["n"] == int(at):
                os.kill(os.getpid(), signal.SIGINT)
        elif _count["n"] >= int(at):
            os.kill(os.getpid(), signal.SIGKILL)


def counted(fn):
    """A mutating method that acts on one thing."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if KILL_ENV in os.environ:  # unarmed (always, outside the tests): no string built on the write path
            tick(what=" ".join(str(a) for a in args[:2] if isinstance(a, (str, tuple))))
        return fn(self, *args, **kwargs)

    wrapper.__killswitch__ = True
    return wrapper


def counted_each(fn):
    """A mutating method whose first argument is a batch: one call per item while armed."""

    @functools.wraps(fn)
    def wrapper(self, items, *args, **kwargs):
        if not armed():
            return fn(self, items, *args, **kwargs)
        out = None
        for item in list(items):
            tick(what=str(item))
            r = fn(self, [item], *args, **kwargs)
            if r is not None:
                out = (out or []) + list(r)
        return out if out is not None else ([] if fn.__name__ != "delete_many" else None)

    wrapper.__killswitch__ = True
    return wrapper


SINGLE = ("rename", "copy", "remove_empty_dirs", "remove_dirs_if_empty", "_put_plain")
EACH = ("delete_many", "move_many", "undelete_many", "abort_uploads")


def instrument(cls) -> None:
    """Wrap the mutating methods a file manager class defines itself."""
    for name in SINGLE + EACH:
        fn = cls.__dict__.get(name)
        if fn is not None and not getattr(fn, "__killswitch__", False):
            setattr(cls, name, (counted_each if name in EACH else counted)(fn))
