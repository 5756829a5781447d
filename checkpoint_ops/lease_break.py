"""``checkpoint-ops lease break``: remove a lease by hand, journaled beside the root it guarded.

For a holder that is hung (its heartbeat still fresh), a lease record nobody can judge, or takeover claims
(``.checkpoint-ops.lease.takeover-*``) in the way of a stale lease: every claim beside the lease goes too,
and claims alone (the lease already free) are removed as well, with the checksum sidecars (``..<name>.crc``)
of all of them. A stale lease (dead pid on this host,
lapsed heartbeat) needs no breaking: the next operation takes it over. The lease
file is moved aside like any deleted file; the journal is history only (``undoable: false``): undo never
puts a lease back.
"""

from __future__ import annotations

import time

from .executor import Anchor, AppliedOperation, JournalHooks, apply_plan
from .lease import LEASE_NAME, TAKEOVER_PREFIX, LeaseState, is_lease_file, read_lease
from .operation import ApplyContext, Operation, Site
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

    def plan(self, stage: bool) -> Plan:
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
        holder = self.state.holder
        if holder is not None and self.state.stale_reason is None:
            age = max(0, int(time.time() - holder.heartbeat_ms / 1000))
            plan.warnings.append(f"its holder renewed it {age} s ago and looks alive: breaking the lease stops its "
                                 "operation at its next heartbeat, where `checkpoint-ops resume` finishes it")
        return plan

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        anchor = Anchor(self.fm, self.root, self.fm.url(self.root), None, checkpoint=False)
        hooks = JournalHooks(undoable=False, extra={"lease": self.state.to_dict()})
        return apply_plan(plan, anchor, {ROOT: (self.fm, self.root)}, ctx.storage_options, False, hooks)

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        return f"Broke the lease of {self.url} ({outcome.op_id}): it was {self.state.describe()}."
