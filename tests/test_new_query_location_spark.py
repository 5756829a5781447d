"""Where Spark starts a new query, and where it refuses to: our verdict against Spark's, case by case.

A location with no file Spark reads is "no checkpoint yet" to compat (the Dagster step's check before a run),
to the health check (``query_owner.not_started``) and to fsck and inspect. Spark 4.1+ starts a new query there
only while ``offsets/``, ``commits/`` and ``state/`` hold nothing, a temp file or an empty directory included
(STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY); a temp file in the root, an empty ``offsets/`` or ``sources/0``
does not stop it. Each case below is built by hand (bad input), judged by us, then started by Spark.
"""

from __future__ import annotations

import os
import uuid

import pytest

from checkpoint_ops.compat import check_compat
from checkpoint_ops.errors import BadInputError
from checkpoint_ops.fsck import run_fsck
from checkpoint_ops.model import Checkpoint
from checkpoint_ops.query_owner import not_started
from checkpoint_ops.storage import open_file_manager
from pipelines.event_counts import counts_writer, write_event_files
from tests.helpers import tree_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores

TEMP = f".0.{uuid.uuid4()}.tmp"

METADATA = "metadata"
# case -> (files, empty directories) under the checkpoint location; Spark starts a new query there or not
CASES = {
    "metadata and a temp file in offsets/": ([METADATA, f"offsets/{TEMP}"], [], False),
    "metadata and a temp file's .crc in offsets/": ([METADATA, f"offsets/.{TEMP}.crc"], [], True),
    "temp files only in state/0/0": ([f"state/0/0/{TEMP}", f"state/0/0/.{TEMP}.crc"], [], False),
    "temp file in the root": ([f".metadata.{uuid.uuid4()}.tmp"], [], True),
    "empty offsets/ and commits/": ([], ["offsets", "commits"], True),
    "empty state/": ([], ["state"], True),
    "empty sources/0": ([], ["sources/0"], True),
    "temp file in offsets/": ([f"offsets/{TEMP}"], [], False),
    "temp file in commits/": ([f"commits/{TEMP}"], [], False),
    "temp file in a state store": ([f"state/0/0/{TEMP}"], [], False),
    "empty state/0": ([], ["state/0"], False),
    "empty state/0/1": ([], ["state/0/1"], False),
    "empty offsets/0": ([], ["offsets/0"], False),
}


def _ours(spark, ckpt: str, inp: str, out: str) -> tuple[bool, str]:
    """(whether compat judges a new query startable here, what it said), after checking that the health check
    agrees: ``not_started`` where no file Spark reads is there, else fsck's errors."""
    fm, root = open_file_manager(ckpt)
    owner = not_started(fm, root, "q", [])
    if owner is not None:
        healthy, health_said = owner.problem is None, str(owner)
    else:
        findings = [f for f in run_fsck(Checkpoint.open(ckpt)) if f.severity == "error"]
        healthy, health_said = not findings, str(findings)
    try:
        report = check_compat(Checkpoint(fm, root), spark, lambda s: counts_writer(s, inp, out).option(
            "checkpointLocation", ckpt).trigger(availableNow=True))
    except BadInputError as e:
        assert not healthy, f"compat refused, the health check did not: {e.render()}; {health_said}"
        return False, e.render()
    assert healthy, f"compat passed, the health check did not: {health_said}"
    return True, report.render()


@pytest.mark.parametrize("case", sorted(CASES))
def test_spark_and_we_agree_where_a_new_query_starts(spark, tmp_path, case):
    files, dirs, spark_starts = CASES[case]
    for key, value in {**SESSION_CONF, **FLAVOURS["hdfs"]}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    inp, out, ckpt = (str(tmp_path / name) for name in ("input", "output", "checkpoint"))
    write_event_files(inp, 0, 2)
    os.makedirs(ckpt)
    for rel in dirs:
        os.makedirs(os.path.join(ckpt, rel))
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(ckpt, rel)), exist_ok=True)
        with open(os.path.join(ckpt, rel), "wb") as f:
            f.write(b'{"id":"6f0c1c9e-7c1b-4a5e-9d38-1c0d2b3e4f50"}' if rel == METADATA else b'{"id":"')
    before = tree_snapshot(ckpt)
    we_start, said = _ours(spark, ckpt, inp, out)
    assert tree_snapshot(ckpt) == before, "judging it changed it"
    if not we_start:
        assert "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in said, said
        assert ("remove the empty directories" if dirs else "Spark never reads a temp file") in said, said

    query = counts_writer(spark, inp, out).option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
        started = True
    except Exception as e:  # noqa: BLE001 - Spark's refusal, checked below
        assert "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in str(e), e
        started = False
    finally:
        unload_state_stores(spark)
    assert started == spark_starts, f"Spark {'started' if started else 'refused'}: the case's expectation is wrong"
    assert we_start == started, f"we said {'start' if we_start else 'refuse'}, Spark did otherwise: {said}"
    if started:
        assert sorted(n for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit()), "Spark ran no batch"
