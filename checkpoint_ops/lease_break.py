"""``checkpoint-ops lease break``: remove a lease by hand, journaled beside the root it guarded.

For a holder on another host that is hung or gone (its heartbeat still fresh), a lease record nobody can
judge, or takeover claims (``.checkpoint-ops.lease.takeover-*``) in the way of a stale lease: every claim
beside the lease goes too, and claims alone (the lease already free) are removed as well, with the checksum
sidecars (``..<name>.crc``) of all of them. A stale lease (dead pid on this host, lapsed heartbeat) needs no
breaking: the next operation takes it over. The lease
file is moved aside like any deleted file; the journal is history only (``undoable: false``): undo never
puts a lease back.

A lease whose holder is a **live process on this host** is never broken (refused, exit 1, naming the holder):
that process can be stopped here, after which its lease is stale and taken over by the next command, while
breaking it stops it only at its next heartbeat, part-way (an operation), or at its next heartbeat and look (a
running query under ``spark.hold_lease_while_active``, or a Dagster run), writing meanwhile. (Except the record a
holder left when it found its lease taken over, ``Holder.outlives_process``: judged by age alone, it is broken
with a warning of when it goes stale by itself, and whether its process still runs.) A live holder on
another host is broken (that is what the command is for), with a warning that says what follows for its kind
(``Holder.kind``) and how long to wait before changing what it guarded.
"""

from __future__ import annotations

import socket
import time

from .errors import RefusedError
from .executor import Anchor, AppliedOperation, JournalHooks, apply_plan
from .lease import LEASE_NAME, TAKEOVER_PREFIX, LeaseState, is_lease_file, read_lease
from .liveness import OPERATION, RUN, RUN_LOOK_S, Holder, pid_running
from .operation import ApplyContext, Operation, Site, require_objects_under
from .plan import Plan
from .storage import open_file_manager

ROOT = "root"


class LeaseBreakOperation(Operation):
    name = "lease-break"
    takes_lease = False  # it removes someone else's

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url
        self.fm, self.root = open_file_manager(url, storage_options)
        self.state: LeaseState | None = None

    def sites(self) -> list[Site]:
        return [Site(self.fm, self.root, self.url)]

    def open(self) -> None:
        self.state = read_lease(self.fm, self.root)
        if not self.state.present and self.fm.strategy == "direct-put":
            require_objects_under(self.fm, self.root, self.url)  # a typo is not "free: nothing to break"

    def plan(self, stage: bool) -> Plan:
        holder = self.state.holder
        if holder is not None and self.state.stale_reason is None and holder.host == socket.gethostname() \
                and not holder.outlives_process:
            _refuse_live_local(self.state)
        plan = Plan(self.name, {ROOT: self.fm.url(self.root)}, None)
        names = sorted(f.name for f in self.fm.list(self.root) if not f.is_dir and is_lease_file(f.name))
        claims = [n for n in names if n.startswith(TAKEOVER_PREFIX)]
        if not self.state.present and not claims:
            plan.summary["lease"] = "free: nothing to break"
            return plan
        for name in names:
            if name == LEASE_NAME:
                plan.delete(ROOT, name, f"the lease, {self.state.describe()}", "litter")
            elif name in claims:  # left by an interrupted takeover, it would keep others from a stale lease
                plan.delete(ROOT, name, "a takeover claim on a lease", "litter")
            else:
                plan.delete(ROOT, name, "a checksum sidecar or temp file of a lease write", "litter")
        plan.summary["lease"] = self.state.describe()
        if claims:
            plan.summary["takeover_claims"] = len(claims)
        if holder is not None and self.state.stale_reason is None:
            plan.warnings.append(_kept_warning(holder) if holder.outlives_process else _live_remote_warning(holder))
        return plan

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        anchor = Anchor(self.fm, self.root, self.fm.url(self.root), None, checkpoint=False)
        hooks = JournalHooks(undoable=False, extra={"lease": self.state.to_dict()})
        return apply_plan(plan, anchor, {ROOT: (self.fm, self.root)}, ctx.storage_options, False, hooks)

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        return f"Broke the lease of {self.url} ({outcome.op_id}): it was {self.state.describe()}."


_STOPS = ("breaking the lease stops its operation at its next heartbeat, where `checkpoint-ops resume` finishes "
          "it")


def _stops_run(holder: Holder) -> str:
    beat = holder.ttl_s / 3
    return (f"breaking the lease stops it once its process next renews the lease and looks (within about {beat:g} s "
            f"plus its watcher's poll, {RUN_LOOK_S:g} s by default and a second for a Dagster run, while that process "
            "runs and reaches the store): its holder stops the query (a "
            "Dagster run fails) and never takes the lease back, but until then the query may commit another batch, "
            "so let that time pass before changing the checkpoint; a hung holder (its heartbeat renewing, its query "
            "not stopping) does not stop: break it only if you know the query has stopped or will")


def _what(holder: Holder) -> str:
    if holder.kind == RUN:
        return "a running query or Dagster run, which holds the lease across its whole run"
    if holder.kind == OPERATION:
        return "a checkpoint-ops operation"
    return f"whatever its owner ({holder.owner}) is: its record does not say whether a query or an operation"


def _kept_warning(holder: Holder) -> str:
    """The record a holder that lost the lease to a takeover left (``Holder.outlives_process``)."""
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder.heartbeat_ms / 1000 + holder.ttl_s))
    alive = holder.host == socket.gethostname() and pid_running(holder.pid, holder.pid_start)
    return (f"this record was left by {holder.owner} (host {holder.host}, pid {holder.pid}) when it found its lease "
            "taken over while it did not renew it: it stops (a query at its watcher's next look, an operation at its "
            "next step; a hung one does not), and so does the process that took the lease over, at its next renewal "
            "(an operation part-way: `checkpoint-ops resume` finishes it); the record keeps the lease from others "
            f"until {until}, when it goes stale by itself. Broken now, the next command may start before they have "
            "stopped" + (f"; pid {holder.pid} is still running on this host" if alive else ""))


def _live_remote_warning(holder: Holder) -> str:
    age = max(0, int(time.time() - holder.heartbeat_ms / 1000))
    head = f"its holder on host {holder.host} (pid {holder.pid}) renewed it {age} s ago and looks alive: "
    if holder.kind == RUN:
        return head + f"it is {_what(holder)}; {_stops_run(holder)}"
    if holder.kind == OPERATION:
        return head + _STOPS
    return (head + f"if it is a checkpoint-ops operation, {_STOPS}; if it is a running query or Dagster run "
            f"(owner: {holder.owner}), breaking the lease may not stop it: a record without its kind was written by an "
            "older release, whose queries run on unprotected after a break and never take the lease back, so the next "
            "command may change the checkpoint under them; break it only if you know the query has stopped")


def _refuse_live_local(state: LeaseState) -> None:
    holder = state.holder
    if holder.kind == OPERATION:
        stop = (f"let it finish, or stop it (kill {holder.pid}): the lease of a process gone from this host is "
                "taken over by the next command, and `checkpoint-ops resume` (or `undo`) finishes its operation")
    else:
        stop = (f"stop it first (a query: query.stop(), or cancel its job or Dagster run; else kill {holder.pid}) "
                "and wait until it has ended: it releases the lease, or the next command takes over the lease of a "
                "process gone from this host")
    raise RefusedError(f"the lease is held by a live process on this host: {holder.describe()}, {_what(holder)}. "
                       "Breaking it would not stop that process at once"
                       + (" (a query runs on until its next heartbeat and look, and a hung one for ever)"
                          if holder.kind != OPERATION else " (it goes on until its next heartbeat, then stops mid-way "
                          "through its operation)"),
                       path=state.url, fix=f"{stop}; `lease break` is for a holder on another host, or hung there")
