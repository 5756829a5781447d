"""The query profiles recorded beside a checkpoint (``query_profile.record_profile`` / ``read_profile``): which
recorded query wrote the batch a checkpoint is at (after a rollback, not the one that ran the batches it removed),
and which records are this checkpoint's at all (the file outlives a checkpoint deleted by hand; a new one at the
same place has another query id). Fast tier: a synthetic checkpoint in Spark's formats, hand-made profiles (the
Spark tests in test_compat_spark.py record real ones)."""

from __future__ import annotations

import json
import os
import shutil

from benchmarks import synthetic
from checkpoint_ops.query_profile import (OperatorProfile, QueryProfile, SinkProfile, profile_path, read_profile,
                                          record_profile)
from checkpoint_ops.storage import open_file_manager
from tests.helpers import cli_json

SINK = SinkProfile("file", "parquet", "/data/out", ())
AGGREGATION = (OperatorProfile(0, "aggregation", "keys key: string; aggregates count(1) AS n", ()),)


def _doc(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _profile(window: str = "", operators=AGGREGATION) -> QueryProfile:
    ops = tuple(OperatorProfile(o.index, o.kind, o.detail, (window,) if window else ()) for o in operators)
    return QueryProfile("append", SINK, (), ops, f"fingerprint {window}", "4.3.0")


def test_after_a_rollback_the_writer_of_the_batch_is_the_query_recorded_before_it(tmp_path):
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=10, partitions=1, retain_state=10)
    fm, root = open_file_manager(ckpt)
    first, changed = _profile("window(ts, '30 seconds')"), _profile("window(ts, '20 seconds')")
    record_profile(fm, root, first, False, None)  # before the first run
    record_profile(fm, root, first, False, 4)  # the same query again: it goes on from where it started
    record_profile(fm, root, changed, False, 6)  # changed after batch 6 (recorded once it ran)
    assert read_profile(fm, root).profile == changed and read_profile(fm, root, as_of=9).profile == changed
    assert read_profile(fm, root, as_of=6).profile == first  # rolled back to 6: batches 7.. are gone
    assert read_profile(fm, root, as_of=3).profile == first and read_profile(fm, root, as_of=3).batch is None
    record_profile(fm, root, first, False, 6)  # the original query accepted again at 6: the change's record goes
    doc = _doc(profile_path(fm, root))
    assert doc["batch"] is None and doc["earlier"] == [], doc  # one record: the first query, from the start
    assert read_profile(fm, root, as_of=9).profile == first


def test_a_record_made_before_the_checkpoint_is_read_for_it_and_takes_its_query_id_when_recorded_again(tmp_path):
    """A first run records before Spark creates the checkpoint (no query id yet); the next record of the same query
    fills it in."""
    ckpt = str(tmp_path / "ck")
    fm, root = open_file_manager(ckpt)
    record_profile(fm, root, _profile(), False, None)
    synthetic.write_local(ckpt, batches=4, partitions=1, retain_state=4)
    query_id = _doc(os.path.join(ckpt, "metadata"))["id"]
    assert read_profile(fm, root, as_of=3, query_id=query_id).query_id is None
    record_profile(fm, root, _profile(), False, 3)
    record = read_profile(fm, root, as_of=3, query_id=query_id)
    assert record.query_id == query_id and record.batch is None


def test_the_records_of_a_checkpoint_deleted_by_hand_are_not_read_for_a_new_one_at_the_same_place(tmp_path):
    """The profile file lives beside the checkpoint and outlives it. A stateful query's record, then the checkpoint
    deleted and a stateless query started at the same place (plain Spark, nothing recorded): fsck named state/
    missing and rollback refused (a second review). Records are per query id: fsck is healthy; compat has no
    record for the new checkpoint; and where the record is the checkpoint's own, state/ deleted is named."""
    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=4, partitions=1, retain_state=4)
    fm, root = open_file_manager(ckpt)
    record_profile(fm, root, _profile(), False, 3)  # recorded with this checkpoint's query id
    state = os.path.join(str(tmp_path), "state-kept")
    shutil.move(os.path.join(ckpt, "state"), state)
    code, f = cli_json("fsck", ckpt)
    assert code == 1 and [x["code"] for x in f["findings"]] == ["state-missing"], f
    assert f["findings"][0]["path"].endswith("/ck/state"), f

    shutil.rmtree(ckpt)  # deleted by hand; a stateless query starts again at the same place
    for rel, data in synthetic.files(batches=4, partitions=1, retain_state=4, operators=0):
        path = os.path.join(ckpt, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(data.replace(b"6f0c1c9e-7c1b-4a5e-9d38-1c0d2b3e4f50", b"11111111-2222-3333-4444-555555555555")
                      if rel == "metadata" else data)
    code, f = cli_json("fsck", ckpt)
    assert code == 0 and f["findings"] == [], f
    code, r = cli_json("rollback", ckpt, "--to-batch", "1", "--dry-run")
    assert code == 0, r
    assert read_profile(fm, root, as_of=3, query_id="11111111-2222-3333-4444-555555555555") is None


def test_something_else_where_the_profile_belongs_is_damage_not_a_refusal(tmp_path):
    """A file where the checkpoint-ops directory should be, or a directory where the profile should be, is damage
    beside the checkpoint, not a store refusing these credentials: reading the profile names it with "remove
    what is there", and fsck, which judges what Spark reads, passes the checkpoint as before."""
    import pytest

    from checkpoint_ops.errors import BadInputError, StorageError

    ckpt = str(tmp_path / "ck")
    synthetic.write_local(ckpt, batches=5, partitions=1, retain_state=5)
    fm, root = open_file_manager(ckpt)
    path = profile_path(fm, root)
    with open(tmp_path / ".checkpoint-ops", "w") as f:  # a file where the directory belongs
        f.write("notes")
    with pytest.raises(BadInputError) as under_a_file:
        read_profile(fm, root)
    assert not isinstance(under_a_file.value, StorageError), under_a_file.value.render()
    assert "not a file" in under_a_file.value.problem and "remove" in under_a_file.value.fix
    code, report = cli_json("fsck", ckpt)
    assert code == 0 and report["findings"] == [], report
    os.remove(tmp_path / ".checkpoint-ops")
    os.makedirs(path)  # a directory where the profile belongs
    with pytest.raises(BadInputError) as a_directory:
        read_profile(fm, root)
    assert not isinstance(a_directory.value, StorageError) and a_directory.value.path.endswith("query-profile.json")
    code, report = cli_json("fsck", ckpt)
    assert code == 0 and report["findings"] == [], report
