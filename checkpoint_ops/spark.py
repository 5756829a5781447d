"""For queries you start yourself: hold the checkpoint's lease while the query is active.

A query started by checkpoint-ops' own runner (the Dagster asset) holds its checkpoint's lease, so every
command refuses to touch that checkpoint while it runs. A query you start with plain PySpark holds none,
and the tool sees nothing of it while it is idle between triggers. Wrap it::

    from checkpoint_ops.spark import hold_lease_while_active

    query = df.writeStream.option("checkpointLocation", ckpt).trigger(processingTime="75 seconds").start(out)
    with hold_lease_while_active(query, ckpt, sinks=[out]):
        query.awaitTermination()

The lease is taken when the helper is called, renewed by a heartbeat while ``query.isActive``, and
released when the query stops or the block ends. The query is started before the helper can be called, so
when the lease cannot be taken (an operation holds it: a rollback may be changing the checkpoint under the
query right now), the helper stops the query (``query.stop()``) before it raises: left running, its next
batch would plan or commit beside that operation. The error names the holder and says the query was stopped.

The lease can also be taken from the query while it runs: by a command that judged it stale (its heartbeat
lapsed: this process was paused, or could not reach the lease's store, for longer than the time to live) or
by ``lease break``. The heartbeat finds the record not its own at its next renewal (every third of the time
to live), and the watcher learns it at its next look (every ``poll_s``); it then stops the query (logged as an
error on the ``checkpoint_ops.spark`` logger), and ``release()`` (the ``with`` block's end) raises ``LeaseLost``.
The two do not go on together once this process runs and reaches the lease's store again; while it is paused or
cut off, Spark's JVM may still run the query beside the new holder, which no lease can prevent.

No PySpark import here: ``query`` is any object with ``isActive`` (a ``StreamingQuery``) and ``stop()``.
"""

from __future__ import annotations

import logging
import threading

from .errors import (STORE_FAILURES, CheckpointOpsError, RefusedError, StorageError, StoreUnavailableError,
                     is_storage_failure, problem_of)
from .lease import LEASE_LEFT_BEHIND, LeaseLost, LeaseSet, acquire_all, lease_root, release_problem
from .liveness import RUN_LOOK_S
from .storage import open_file_manager

POLL_SECONDS = RUN_LOOK_S
_log = logging.getLogger(__name__)


class ActiveQueryLease:
    """The leases of a running query's checkpoint (and file sinks), released when it stops. ``lost``: why the
    watcher stopped the query, the lease having been taken from it (None: it was not)."""

    def __init__(self, query, leases: LeaseSet, poll_s: float = POLL_SECONDS):
        self.query = query
        self.leases = leases
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_query, args=(poll_s,), name="checkpoint-ops-query-lease",
                                       daemon=True)
        self._watch.start()

    def _watch_query(self, poll_s: float) -> None:
        while not self._stop.wait(poll_s):
            try:
                self.leases.check()  # the heartbeat found the record another holder's
            except LeaseLost as e:
                self._taken(e)
                break
            try:
                active = bool(self.query.isActive)
            except Exception:  # noqa: BLE001 - the session is gone: so is the query
                active = False
            if not active:
                break
        if self.lost is None:  # taken since the last look (one read): said, not released as if it were ours
            try:
                self.leases.verify()
            except LeaseLost as e:
                self._taken(e)
            except (OSError, *STORE_FAILURES):
                pass  # the release below says what the store did
        left = self.leases.release_quietly()  # on this thread: told, not a thread's traceback
        if left is not None:
            _log.warning("the streaming query's lease could not be released (%s); %s", release_problem(left),
                         LEASE_LEFT_BEHIND)

    def _taken(self, e: LeaseLost) -> None:
        """Another holder has the lease: it may be changing the checkpoint now, so the query stops."""
        name, where = _name(self.query), lease_root(e.path) if e.path else "CHECKPOINT"
        self.lost = LeaseLost(
            f"{e.problem}; the query {name} was {_stop(self.query)}: it must not run while another holder may be "
            "changing its checkpoint", path=e.path,
            fix=f"see who holds the lease now (`checkpoint-ops lease show {where}`): a command took it over because "
                "this query's heartbeat lapsed (the process was paused, or could not reach the lease's store, for "
                "longer than the lease's time to live), or it was broken by hand; once that holder is done, start the "
                "query again and call hold_lease_while_active right after start()")
        self.lost.__cause__ = e
        _log.error("%s", self.lost.render())

    def release(self) -> None:
        """Release now (the query may go on, unprotected). Raises ``LeaseLost`` if the lease was taken from the
        query meanwhile (the query was stopped then)."""
        self._end()
        if self.lost is not None:
            raise self.lost

    def _end(self) -> None:
        self._stop.set()
        if self._watch is not threading.current_thread():
            self._watch.join()

    def __enter__(self) -> "ActiveQueryLease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._end()
        if self.lost is None:
            return
        if exc_type is None:
            raise self.lost
        if isinstance(exc, BaseException):  # the error on its way out is raised (the other holder may have caused it)
            exc.add_note(f"checkpoint-ops: {self.lost.render()}")


def _name(query) -> str:
    return getattr(query, "name", None) or getattr(query, "id", None) or "a streaming query"


def hold_lease_while_active(query, checkpoint: str, sinks: list[str] = (), owner: str | None = None,
                            storage_options: dict | None = None, poll_s: float = POLL_SECONDS) -> ActiveQueryLease:
    """Take the lease of ``checkpoint`` (and of each file sink output) for ``query``; it is renewed while
    the query is active and released when it stops (module docstring)."""
    name = _name(query)
    owner = owner or f"spark query {name} (hold_lease_while_active)"
    again = "start the query again and call hold_lease_while_active right after start()"
    leases = None
    try:
        sites = []
        for url in [checkpoint, *sinks]:
            fm, root = open_file_manager(url, storage_options)
            sites.append((fm, root, url))
        leases = acquire_all(sites, owner, stepwise=False, warn=_log.warning)  # told: what a refusal left behind
        return ActiveQueryLease(query, leases, poll_s)
    except BaseException as e:  # whatever kept the lease from it (a Ctrl-C too), the query must not run unguarded
        stopped = _stop(query)
        if leases is not None:  # taken, then interrupted before the caller got it: not left renewing
            left = leases.release_on_error()
            if left is not None:
                _log.warning("the streaming query's lease could not be released (%s); %s", release_problem(left),
                             LEASE_LEFT_BEHIND)
        if isinstance(e, StoreUnavailableError):  # no other holder: the store did not answer
            raise e.finish_with(f"the query {name} was {stopped}: it must not run without its lease; once the store "
                                f"answers, {again}") from e
        if isinstance(e, RefusedError):  # another holder (LeaseHeld)
            raise RefusedError(f"{e.problem}; the query {name} was {stopped}: it must not run while another holder "
                               "may be changing its checkpoint", path=e.path,
                               fix=f"wait until that holder is done (`checkpoint-ops lease show "
                                   f"{lease_root(e.path) if e.path else checkpoint}`), then {again}") from e
        if isinstance(e, CheckpointOpsError) or is_storage_failure(e):  # refused (access denied, no space...)
            raise StorageError(f"the lease could not be taken: {problem_of(e)}; the query {name} was {stopped}: it must "
                               "not run without its lease", path=getattr(e, "path", None) or checkpoint,
                               fix=f"mend what the store refused (credentials, permissions, space, storage options), "
                                   f"then {again}") from e
        raise  # a bug or an interrupt: the query is stopped all the same


def _stop(query) -> str:
    """Stop a query the lease could not protect; says what became of it."""
    try:
        query.stop()
    except Exception as e:  # noqa: BLE001 - say so; the lease error is the one to raise
        return f"left running (stopping it failed: {e}); stop it yourself now"
    return "stopped"
