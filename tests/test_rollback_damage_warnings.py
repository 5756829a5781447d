"""A rollback that removes damaged files is a repair: its plan warns about each damaged file it removes
(``restart.damage_in_removed``). The newest removed file of each directory is judged whole (size, content, a
state file's checksum sidecar; a log file's stale sidecar is no damage, Spark does not check it:
``tests/test_stale_crc_spark.py``); older removed files only where the listing knows their size without a ``stat``. Fast tier:
a synthetic checkpoint in Spark's formats, no Spark."""

from __future__ import annotations

import os

import pytest

from benchmarks import synthetic
from checkpoint_ops.ledger import ledger_or_none
from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.rollback import plan_rollback
from checkpoint_ops.storage.checksums import hadoop_crc_bytes

TARGET = 30
AFTER = f"; it is removed with the batches after {TARGET}"


@pytest.fixture()
def damaged(tmp_path):
    root = str(tmp_path / "ck")
    synthetic.write_local(root, batches=40, partitions=2, retain_state=40)

    def path(rel):
        return os.path.join(root, rel)

    open(path("commits/39"), "wb").close()  # the newest commit, torn
    with open(path("offsets/.39.crc"), "wb") as f:  # the newest offsets file's sidecar, stale
        f.write(hadoop_crc_bytes(b"x" * 2000))  # four chunks: a sidecar of another size
    newest_delta = path("state/0/1/40.snapshot")
    data = open(newest_delta, "rb").read()
    with open(newest_delta, "wb") as f:  # the newest state file of one partition, cut short
        f.write(data[: len(data) // 2])
    with open(path("state/0/1/.40.snapshot.crc"), "wb") as f:
        f.write(hadoop_crc_bytes(data[: len(data) // 2]))
    open(path("commits/35"), "wb").close()  # an older removed commit, torn
    open(path("commits/20"), "wb").close()  # a kept commit, torn: not the rollback's to warn about
    return root


def test_warns_about_each_damaged_newest_file_it_removes(damaged):
    ckpt = Checkpoint.open(damaged)
    plan = plan_rollback(ckpt, TARGET, ledger=ledger_or_none(ckpt), force=True)
    removed = [w for w in plan.warnings if w.endswith(AFTER)]
    assert f"commits/39 is torn (0 bytes){AFTER}" in removed
    assert not [w for w in removed if w.startswith("offsets/39 ")], removed  # its stale sidecar: no damage
    assert [w for w in removed if w.startswith("state/0/1/40.snapshot ")], removed
    # on a local disk an older removed file is not stat'ed for a warning about a file being deleted anyway
    assert not [w for w in removed if w.startswith(("commits/35 ", "commits/20 "))], removed
    assert len(removed) == 2, removed


def test_where_the_listing_knows_sizes_older_removed_files_are_judged_too(damaged):
    ckpt = Checkpoint.open(damaged)
    for info in ckpt.listing.files.values():  # as an object store's listing is: every size known
        info.size
    plan = plan_rollback(ckpt, TARGET, ledger=ledger_or_none(ckpt), force=True)
    removed = [w for w in plan.warnings if w.endswith(AFTER)]
    assert f"commits/35 is torn (0 bytes){AFTER}" in removed
    assert f"commits/39 is torn (0 bytes){AFTER}" in removed
    assert not [w for w in removed if w.startswith("commits/20 ")], removed
    assert len(removed) == 3, removed
