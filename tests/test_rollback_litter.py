"""A rollback also clears the checkpoint's litter: leftover temp files with their sidecars, and checksum
sidecars whose file is gone, including the sidecar of a temp file that is gone (once kept forever, as if a
temp file still went with it). Fast tier: a synthetic checkpoint in Spark's formats, no Spark."""

from __future__ import annotations

import os

from benchmarks import synthetic
from checkpoint_ops.fsck import Fsck
from checkpoint_ops.ledger import ledger_or_none
from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.rollback import plan_rollback
from checkpoint_ops.storage.checksums import hadoop_crc_bytes

UID = "0b3c5d6e-aaaa-bbbb-cccc-123456789abc"


def test_rollback_to_the_last_batch_deletes_exactly_the_litter(tmp_path):
    root = str(tmp_path / "ck")
    synthetic.write_local(root, batches=10, partitions=2, retain_state=10)
    litter = {
        f"offsets/.10.{UID}.tmp": b"v1\n{",  # a temp file and its sidecar
        f"offsets/..10.{UID}.tmp.crc": hadoop_crc_bytes(b"v1\n{"),
        f"commits/..10.{UID}.tmp.crc": hadoop_crc_bytes(b""),  # the sidecar of a temp file that is gone
        "commits/.99.crc": hadoop_crc_bytes(b"v1\n{}"),  # the sidecar of a batch file that is gone
        "offsets/.notes.tmp.crc": hadoop_crc_bytes(b"notes"),  # of a visible name that is gone
    }
    for rel, data in litter.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    ckpt = Checkpoint.open(root)
    plan = plan_rollback(ckpt, 9, ledger=ledger_or_none(ckpt))
    deleted = sorted(a.rel for a in plan.actions if a.kind == "delete")
    assert deleted == sorted(litter)
    assert not [a for a in plan.actions if a.kind != "delete"]


def test_sidecars_left_under_state_outside_any_store_are_litter_too(tmp_path):
    """Under ``state/``, the state scan finds the orphan sidecars of a store's own folder; an orphan sidecar
    of an operator's metadata or schema folder, or of a store's ``_metadata``, ``SSTs`` or ``logs``, was
    neither reported by fsck nor removed by a rollback. Both are now."""
    root = str(tmp_path / "ck")
    synthetic.write_local(root, batches=10, partitions=2, retain_state=10)
    litter = {
        "state/0/_metadata/.gone.crc": hadoop_crc_bytes(b"gone"),
        "state/0/1/_metadata/.schema-old.crc": hadoop_crc_bytes(b"old"),
        "state/0/1/SSTs/.gone.sst.crc": hadoop_crc_bytes(b"sst"),
        "state/0/1/logs/.gone.log.crc": hadoop_crc_bytes(b"log"),
        "state/0/_stateSchema/default/.gone.crc": hadoop_crc_bytes(b"schema"),
        "state/0/1/.11.delta.crc": hadoop_crc_bytes(b"x"),  # a store's own (found before too)
    }
    for rel, data in litter.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    ckpt = Checkpoint.open(root)
    orphans = sorted(f.path for f in Fsck(ckpt).run() if f.code == "orphan-crc")
    assert orphans == sorted(ckpt.listing.url(rel) for rel in litter)
    plan = plan_rollback(ckpt, 9, ledger=ledger_or_none(ckpt))
    assert sorted(a.rel for a in plan.actions if a.kind == "delete") == sorted(litter)
