"""Ledger segments are applied in name order: a sync written right after a rollback's truncation
(the query ran again at once) must come after it, even within the same second."""

from __future__ import annotations

from checkpoint_ops.ledger import Ledger
from checkpoint_ops.storage import open_file_manager


def test_a_sync_right_after_a_truncation_survives_it(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    ledger = Ledger(fm, f"{root}/ledger")
    ledger._write_segment("sync", b'{"batch":5,"offsets":"old timeline"}\n')
    ledger.truncate(3, "op1")
    ledger._write_segment("sync", b'{"batch":4,"offsets":"new timeline"}\n')
    again = Ledger(fm, f"{root}/ledger")
    assert {b: r["offsets"] for b, r in again.records.items()} == {4: "new timeline"}
