"""compat on real checkpoints: one query change per rule of the guide ("Recovery Semantics after Changes in
a Streaming Query"), each judged by ``check_compat`` (Spark restarts the changed query on a scratch copy,
noop sink) and then **confirmed by a real restart**: the changed query, with its real sink, restarts on the
checkpoint with new input, and Spark either fails with the stated error or runs with the stated result.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Callable

import pytest

from checkpoint_ops.compat import CHECK, FAILS, SAFE, SILENT, accept, check_compat
from checkpoint_ops.errors import BadInputError
from checkpoint_ops.model import Checkpoint
from checkpoint_ops.query_profile import profile_path
from checkpoint_ops.storage import open_file_manager
from pipelines.event_counts import WINDOW_SECONDS, counts_writer, event_rows, read_events, windowed_counts
from tests.compat_queries import (CompatBase, batch_writer, dedup_writer, join_writer, partitioned_writer,
                                  restart_for_real, use_session_conf, write_json_events)
from tests.helpers import tree_snapshot
from tests.spark_runs import FLAVOURS

ROCKSDB = FLAVOURS["rocksdb"]["spark.sql.streaming.stateStore.providerClass"]


# ---- the changed queries ------------------------------------------------------------------------------


def _windowed(events, *extra_keys, with_max: bool = False, seconds: int = WINDOW_SECONDS):
    from pyspark.sql import functions as F

    aggregates = [F.count("*").alias("n"), F.sum("value").alias("total")]
    columns = ["window_start", "key", "n", "total"]
    if with_max:
        aggregates.append(F.max("value").alias("biggest"))
        columns.append("biggest")
    return (events.withWatermark("ts", "0 seconds")
            .groupBy(F.window("ts", f"{seconds} seconds"), "key", *extra_keys).agg(*aggregates)
            .withColumnRenamed("window", "w").selectExpr("w.start AS window_start", *columns[1:]))


def _to_parquet(frame, base: CompatBase, mode: str = "append", output: str | None = None):
    return frame.writeStream.format("parquet").outputMode(mode).option("path", output or base.output)


def filter_changed(spark, base):
    return _to_parquet(windowed_counts(read_events(spark, base.dir("input")).where("value % 2 = 0")), base)


def value_scaled_before_aggregation(spark, base):
    return _to_parquet(windowed_counts(read_events(spark, base.dir("input")), value_scale=2), base)


def rate_limit_changed(spark, base):
    return _to_parquet(windowed_counts(read_events(spark, base.dir("input"), max_files_per_trigger=2)), base)


def source_added(spark, base):
    both = read_events(spark, base.dir("input")).unionByName(read_events(spark, base.dir("input2")))
    return _to_parquet(windowed_counts(both), base)


def source_kind_changed(spark, base):
    rate = spark.readStream.format("rate").option("rowsPerSecond", 1).load() \
        .selectExpr("CAST(value AS STRING) AS key", "value", "timestamp AS ts")
    return _to_parquet(windowed_counts(rate), base)


def source_path_changed(spark, base):
    return counts_writer(spark, base.dir("input2"), base.output)


def operator_added(spark, base):
    events = read_events(spark, base.dir("input")).withWatermark("ts", "0 seconds") \
        .dropDuplicates(["key", "value", "ts"])
    return _to_parquet(windowed_counts(events), base)


def operator_removed(spark, base):
    return _to_parquet(read_events(spark, base.dir("input")), base)


def aggregation_key_changed(spark, base):
    from pyspark.sql import functions as F

    return _to_parquet(windowed_counts(read_events(spark, base.dir("input")).withColumn("key", F.length("key"))), base)


def aggregate_added(spark, base):
    return _to_parquet(_windowed(read_events(spark, base.dir("input")), with_max=True), base)


NEW_WINDOW_SECONDS = 20  # the agg base's windows are WINDOW_SECONDS (30) long


def window_length_changed(spark, base):
    return _to_parquet(_windowed(read_events(spark, base.dir("input")), seconds=NEW_WINDOW_SECONDS), base)


def complete_mode_on_file_sink(spark, base):
    return _to_parquet(windowed_counts(read_events(spark, base.dir("input"))), base, mode="complete")


CAPTURED: dict[int, list] = {}


def _capture(df, batch_id):
    CAPTURED[batch_id] = [r.asDict() for r in df.collect()]


def update_mode_into_foreach_batch(spark, base):
    counts = windowed_counts(read_events(spark, base.dir("input")))
    return counts.writeStream.outputMode("update").foreachBatch(_capture)


def file_sink_to_foreach_batch(spark, base):
    return windowed_counts(read_events(spark, base.dir("input"))).writeStream.foreachBatch(_capture)


def file_sink_path_changed(spark, base):
    return counts_writer(spark, base.dir("input"), base.dir("other-output"))


def shuffle_partitions_changed(spark, base):
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    return counts_writer(spark, base.dir("input"), base.output)


def provider_changed(spark, base):
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    return counts_writer(spark, base.dir("input"), base.output)


def dedup_columns_changed(spark, base):
    return dedup_writer(spark, base, columns=("key", "value"))


def join_keys_changed(spark, base):
    return join_writer(spark, base, on_value=True)


def join_type_changed(spark, base):
    return join_writer(spark, base, how="left_outer")


def join_source_removed(spark, base):
    return _to_parquet(read_events(spark, base.dir("left")), base)


def aggregation_added_to_stateless(spark, base):
    return windowed_counts(read_events(spark, base.dir("input"))).writeStream.foreachBatch(batch_writer(base.output))


def foreach_batch_to_file_sink(spark, base):
    return _to_parquet(read_events(spark, base.dir("input")), base, output=base.dir("file-output"))


def partition_columns_changed(spark, base):
    return partitioned_writer(spark, base, columns=("value",))


def partitioning_removed(spark, base):
    return partitioned_writer(spark, base, columns=())


def partitioning_added(spark, base):
    return dedup_writer(spark, base).partitionBy("key")


# ---- what a real restart must show ----------------------------------------------------------------------


def fails_with(*texts: str, once: bool = False) -> Callable:
    """The real restart (one new input file) fails, and Spark's error says ``texts``."""
    def confirm(spark, base, build):
        base.add_events(BASE_FILES_NEXT, BASE_FILES_NEXT + 1, "left" if base.name == "join" else "input")
        if base.name == "join":
            base.add_events(BASE_FILES_NEXT, BASE_FILES_NEXT + 1, "right")
        real = restart_for_real(spark, build(spark, base), base.checkpoint, once=once)
        assert not real.ok, f"Spark restarted: {real.progress}"
        for text in texts:
            assert text in real.error, real.error

    return confirm


BASE_FILES_NEXT = 3  # the next input file of the agg, dedup and stateless bases (the join base: 2)


def runs_over_new_input(spark, base, build):
    first = base_batch(base) + 1
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert real.batch(first)["numInputRows"] == 5


def base_batch(base) -> int:
    return Checkpoint.open(base.checkpoint).latest_commit


def reads_at_new_rate(spark, base, build):
    first = base_batch(base) + 1
    base.add_events(3, 5)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert real.batch(first)["numInputRows"] == 10  # two files in one batch: the new maxFilesPerTrigger applies


def reads_every_file_of_the_new_path(spark, base, build):
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert real.input_rows == 10  # both files of input2/, none of input/ again


def update_mode_emits_open_windows(spark, base, build):
    CAPTURED.clear()
    first = base_batch(base) + 1
    base.add_events(3, 4)  # events at 30..34 s: the window [30, 60) stays open (watermark 34 s)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    open_window = [r for r in CAPTURED[first] if r["window_start"].timestamp() == 30]
    assert open_window and all(r["n"] < 15 for r in open_window)  # partial counts; append emits none of them


def foreach_batch_gets_the_next_batches(spark, base, build):
    CAPTURED.clear()
    first = base_batch(base) + 1
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert min(CAPTURED) == first and real.batch(first)["numInputRows"] == 5


def state_keeps_two_partitions(spark, base, build):
    batch = base_batch(base)
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    partitions = sorted(d for d in os.listdir(os.path.join(base.checkpoint, "state", "0")) if d.isdigit())
    assert partitions == ["0", "1"]  # not 4: the session's setting had no effect
    assert Checkpoint.open(base.checkpoint).offsets(batch + 1).conf["spark.sql.shuffle.partitions"] == "2"


def state_stays_in_hdfs_provider(spark, base, build):
    batch = base_batch(base)
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    files = os.listdir(os.path.join(base.checkpoint, "state", "0", "0"))
    assert f"{batch + 2}.delta" in files  # the HDFS provider wrote the new version
    assert not [f for f in files if f.endswith((".zip", ".changelog"))]  # RocksDB never ran


def left_outer_emits_unmatched_rows(spark, base, build):
    write_json_events(base.dir("left"), "lonely.json", [{"key": "zz", "value": 7, "ts": "1970-01-01T00:00:30Z"}], 10)
    for side, index in (("left", 11), ("right", 12)):  # far later events on both sides move the watermark on
        write_json_events(base.dir(side), "later.json", [{"key": "k0", "value": 1, "ts": "1970-01-01T00:05:00Z"}],
                          index)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    rows = spark.read.parquet(base.output).where("key = 'zz'").collect()
    assert [(r["key"], r["rkey"]) for r in rows] == [("zz", None)]  # an inner join never emits it


def new_file_sink_log_breaks_readers_then_fails(spark, base, build):
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error  # batch 3 is written, into a log that starts at 3
    with pytest.raises(Exception, match="_spark_metadata/0 doesn't exist"):
        spark.read.parquet(base.dir("file-output")).count()
    base.add_events(4, 5)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert not real.ok and "[BATCH_METADATA_NOT_FOUND]" in real.error  # batch 4 compacts the log


def sums_mix_old_and_new_values(spark, base, build):
    # an event at 27 s joins the window [0, 30) the state keeps open; events at 40..44 s then close it
    write_json_events(base.dir("input"), "late.json", [{"key": "k0", "value": 100, "ts": "1970-01-01T00:00:27Z"}],
                      BASE_FILES_NEXT)
    base.add_events(4, 5)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    (row,) = spark.read.parquet(base.output).where("key = 'k0' AND window_start = '1970-01-01 00:00:00'").collect()
    old_values = sum(e["value"] for i in range(BASE_FILES_NEXT) for e in event_rows(i) if e["key"] == "k0")
    assert row["total"] == old_values + 2 * 100  # unscaled sums from the state plus the new, scaled, value


def windows_of_both_lengths(spark, base, build):
    base.add_events(3, 6)  # events at 30..54 s: the watermark passes 30 and 40
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    counts: dict[int, int] = {}
    for row in spark.read.parquet(base.output).collect():
        start = int(row["window_start"].timestamp())
        counts[start] = counts.get(start, 0) + row["n"]
    # [0, 30) from the old state (events 0..24: a 20-second window holds 10), then 20-second windows: [20, 40)
    # holds only the new events 30..34 (20..24 were counted in [0, 30))
    assert counts == {0: 15, 20: 5}, counts


def readers_fail_on_conflicting_partitions(spark, base, build):
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert {n.split("=")[0] for n in os.listdir(base.output) if "=" in n} == {"key", "value"}
    with pytest.raises(Exception, match="CONFLICTING_PARTITION_COLUMN_NAMES"):
        spark.read.parquet(base.output).count()


def readers_miss_the_new_rows(spark, base, build):
    base.add_events(3, 4)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert real.input_rows == 5  # written, at the top of the output
    assert spark.read.parquet(base.output).count() == 15  # the rows of batches 0..2 alone


def readers_miss_the_old_rows(spark, base, build):
    before = spark.read.parquet(base.output).count()
    write_json_events(base.dir("input"), "new-key.json", [{"key": "zz", "value": 7, "ts": "1970-01-01T00:00:40Z"}],
                      BASE_FILES_NEXT)
    real = restart_for_real(spark, build(spark, base), base.checkpoint)
    assert real.ok, real.error
    assert before == 3 and [r["key"] for r in spark.read.parquet(base.output).collect()] == ["zz"]


# ---- the cases -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    base: str
    build: Callable
    compatible: bool
    aspect: str  # the difference the case is about
    verdict: str
    error_class: str | None
    confirm: Callable
    also: tuple[tuple[str, str], ...] = field(default=())  # other (aspect, verdict) the change brings


CASES = [
    # projection / filter: allowed
    Case("filter-changed", "agg", filter_changed, True, "projection", SAFE, None, runs_over_new_input),
    # a projection below a stateful operator: Spark accepts it; whether the results mix is for a person to judge
    Case("value-scaled-before-aggregation", "agg", value_scaled_before_aggregation, False, "projection", CHECK, None,
         sums_mix_old_and_new_values),
    # source options: rate limits may change
    Case("rate-limit-changed", "agg", rate_limit_changed, True, "source-options", SAFE, None, reads_at_new_rate),
    # sources: number and type may not change; a file source's path is not checked by Spark
    Case("source-added", "agg", source_added, False, "sources", FAILS, None,
         fails_with("There are [1] sources in the checkpoint offsets and now there are [2]", "AssertionError")),
    Case("source-removed", "join", join_source_removed, False, "sources", FAILS, None,
         fails_with("There are [2] sources in the checkpoint offsets and now there are [1]")),
    Case("source-kind-changed", "agg", source_kind_changed, False, "sources", FAILS, None,
         fails_with("NumberFormatException", once=True)),
    Case("source-path-changed", "agg", source_path_changed, False, "sources", SILENT, None,
         reads_every_file_of_the_new_path),
    # stateful operators: no addition, removal or schema change
    Case("stateful-operator-added", "agg", operator_added, False, "stateful-operators", FAILS,
         "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
         fails_with("[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA]")),
    Case("stateful-operator-removed", "agg", operator_removed, False, "stateful-operators", FAILS,
         "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
         fails_with("[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA]")),
    Case("stateful-operator-added-to-stateless", "stateless", aggregation_added_to_stateless, False,
         "stateful-operators", FAILS, "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
         fails_with("[STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY]")),
    Case("aggregation-key-changed", "agg", aggregation_key_changed, False, "state-schema", FAILS,
         "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", fails_with("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE]")),
    Case("aggregate-added", "agg", aggregate_added, False, "state-schema", FAILS,
         "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", fails_with("[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE]")),
    Case("dedup-columns-changed", "dedup", dedup_columns_changed, False, "state-schema", FAILS,
         "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", fails_with("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE]")),
    Case("join-keys-changed", "join", join_keys_changed, False, "state-schema", FAILS,
         "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", fails_with("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE]")),
    Case("join-type-changed", "join", join_type_changed, False, "stateful-operators", SILENT, None,
         left_outer_emits_unmatched_rows),
    Case("window-length-changed", "agg", window_length_changed, False, "stateful-operators", SILENT, None,
         windows_of_both_lengths),
    # output mode: not recorded, not checked by Spark; a file sink takes append only
    Case("output-mode-complete-on-file-sink", "agg", complete_mode_on_file_sink, False, "output-mode", FAILS,
         "STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE",
         fails_with("[STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE]")),
    Case("output-mode-append-to-update", "agg", update_mode_into_foreach_batch, False, "output-mode", SILENT, None,
         update_mode_emits_open_windows, also=(("sink", SAFE),)),
    # sinks: file -> other allowed; a file sink's directory may not change; other -> file sink not allowed
    Case("sink-file-to-foreach-batch", "agg", file_sink_to_foreach_batch, True, "sink", SAFE, None,
         foreach_batch_gets_the_next_batches),
    Case("file-sink-path-changed", "agg", file_sink_path_changed, False, "sink", FAILS, "BATCH_METADATA_NOT_FOUND",
         fails_with("[BATCH_METADATA_NOT_FOUND]")),
    Case("sink-foreach-batch-to-file", "stateless", foreach_batch_to_file_sink, False, "sink", SILENT,
         "BATCH_METADATA_NOT_FOUND", new_file_sink_log_breaks_readers_then_fails),
    # a file sink's partitionBy: not in the checkpoint, not checked by Spark; its readers need one partitioning
    Case("file-sink-partition-columns-changed", "partitioned", partition_columns_changed, False, "sink", SILENT,
         "CONFLICTING_PARTITION_COLUMN_NAMES", readers_fail_on_conflicting_partitions),
    Case("file-sink-partitioning-removed", "partitioned", partitioning_removed, False, "sink", SILENT, None,
         readers_miss_the_new_rows),
    Case("file-sink-partitioning-added", "dedup", partitioning_added, False, "sink", SILENT, None,
         readers_miss_the_old_rows),
    # settings the offsets log pins
    Case("shuffle-partitions-changed", "agg", shuffle_partitions_changed, False, "conf", SILENT, None,
         state_keeps_two_partitions),
    Case("state-store-provider-changed", "agg", provider_changed, False, "conf", SILENT, None,
         state_stays_in_hdfs_provider),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verdict_then_real_restart_agrees(spark, compat_bases, case):
    base = compat_bases(case.base)
    base.reset()
    use_session_conf(spark)
    try:
        before = tree_snapshot(base.root)
        report = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: case.build(s, base))
        assert tree_snapshot(base.root) == before, "compat changed files"

        found = {(d.aspect, d.verdict) for d in report.differences}
        assert (case.aspect, case.verdict) in found, report.render()
        assert found == {(case.aspect, case.verdict), *case.also}, report.render()
        assert report.compatible is case.compatible and report.exit_code == (0 if case.compatible else 1)
        (main,) = [d for d in report.differences if d.aspect == case.aspect]
        assert main.error_class == case.error_class, report.render()
        assert main.rule and main.effect
        if case.verdict == FAILS and main.found_by == "spark":
            assert report.spark_restarts is False
        elif case.verdict != FAILS or main.aspect in ("output-mode", "sink"):
            assert report.spark_restarts is True, report.render()  # Spark's own checks passed

        use_session_conf(spark)
        case.confirm(spark, base, case.build)
    finally:
        use_session_conf(spark)
        base.reset()


def _as_recorded_by_an_earlier_release(base: CompatBase) -> None:
    """The base's recorded profile without what earlier releases did not record (partitionBy, time windows, UDF
    code)."""
    fm, root = open_file_manager(base.checkpoint)
    doc = json.loads(fm.read_bytes(profile_path(fm, root)))
    doc["profile"]["sink"].pop("partition_by")
    doc["profile"].pop("state_hash")
    doc["profile"].pop("udfs")
    for operator in doc["profile"]["operators"]:
        operator.pop("windows")
    fm.write_bytes(profile_path(fm, root), json.dumps(doc).encode(), overwrite=True)


@pytest.mark.parametrize("base_name, build, unknown, verdicts", [
    ("partitioned", partitioning_removed, "partitionBy columns are unknown", set()),
    ("agg", window_length_changed, "time windows (durations) of the recorded query's aggregations are unknown",
     {("projection", CHECK)}),  # no longer "safe": where the plan changed is unknown
], ids=["partitioning", "windows"])
def test_what_an_earlier_release_did_not_record_is_unknown_never_a_difference(spark, compat_bases, base_name, build,
                                                                              unknown, verdicts):
    base = compat_bases(base_name)
    base.reset()
    use_session_conf(spark)
    try:
        _as_recorded_by_an_earlier_release(base)
        report = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: build(s, base))
        assert report.spark_restarts is True, report.render()
        assert {(d.aspect, d.verdict) for d in report.differences} == verdicts, report.render()
        assert any(unknown in note and "--record" in note for note in report.notes), report.render()
    finally:
        use_session_conf(spark)
        base.reset()


# ---- a Python UDF below the aggregation: the plan prints it as `<lambda>(value)` whatever its body --------


def udf_before_aggregation(spark, base, changed: bool = False):
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    value = F.udf(lambda v: v * 2, LongType()) if changed else F.udf(lambda v: v, LongType())
    return _to_parquet(windowed_counts(read_events(spark, base.dir("input")).withColumn("value", value("value"))),
                       base)


_RECORD_IN_A_FRESH_PROCESS = """
import sys
from checkpoint_ops.query_profile import describe_query, record_profile
from checkpoint_ops.storage import open_file_manager
from tests.compat_queries import CompatBase, use_session_conf
from tests.spark_runs import make_session
from tests.test_compat_spark import udf_before_aggregation

spark = make_session()
use_session_conf(spark)
base = CompatBase(sys.argv[1], sys.argv[2])
fm, root = open_file_manager(base.checkpoint)
record_profile(fm, root, describe_query(spark, udf_before_aggregation(spark, base)), judged=False, batch=None)
spark.stop()
"""


def test_a_changed_udf_body_below_an_aggregation_is_to_check_by_hand(spark, compat_bases):
    """The query with a UDF is recorded by another process (its own Spark session): judged again unchanged it is
    compatible; with the UDF's body changed (v -> v * 2) it is to check by hand, and a real restart mixes old and
    new sums in the state, as with the same change without a UDF (value-scaled-before-aggregation)."""
    import subprocess
    import sys

    base = compat_bases("agg")
    base.reset()
    use_session_conf(spark)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        subprocess.run([sys.executable, "-c", _RECORD_IN_A_FRESH_PROCESS, base.name, base.root], cwd=root,
                       env={**os.environ, "PYTHONPATH": root}, check=True, timeout=600, capture_output=True)

        same = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: udf_before_aggregation(s, base))
        assert same.compatible and same.exit_code == 0 and not same.differences, same.render()

        before = tree_snapshot(base.root)
        report = check_compat(Checkpoint.open(base.checkpoint), spark,
                              lambda s: udf_before_aggregation(s, base, changed=True))
        assert tree_snapshot(base.root) == before, "compat changed files"
        assert {(d.aspect, d.verdict) for d in report.differences} == {("projection", CHECK)}, report.render()
        assert not report.compatible and report.exit_code == 1 and report.spark_restarts is True
        (main,) = report.differences
        assert "<lambda>" in main.was and "<lambda>" in main.now and main.was != main.now, report.render()

        use_session_conf(spark)
        sums_mix_old_and_new_values(spark, base, lambda s, b: udf_before_aggregation(s, b, changed=True))
    finally:
        use_session_conf(spark)
        base.reset()


def test_without_a_recorded_profile_a_stateful_query_is_checked_by_hand_until_the_old_one_is_recorded(
        spark, compat_bases):
    """A checkpoint written before checkpoint-ops was adopted has no query profile. Spark's restart judges only
    the state's schema, so a join turned from inner to left outer restarts, and emits rows the old query never
    did: without a profile that is "check by hand", never "compatible" (a hostile review). Once the query that
    wrote it is recorded (`--record` with the old query), the same change is named as silently different."""
    base = compat_bases("join")
    base.reset()
    use_session_conf(spark)
    try:
        fm, root = open_file_manager(base.checkpoint)
        fm.delete(profile_path(fm, root))
        report = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: join_type_changed(s, base))
        assert report.spark_restarts is True and not report.compatible and report.exit_code == 1, report.render()
        (diff,) = report.differences
        assert (diff.aspect, diff.verdict) == ("stateful-operators", CHECK), report.render()
        assert "no query profile is recorded" in diff.effect and "--record" in diff.effect

        old = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: join_writer(s, base))
        assert [(d.aspect, d.verdict) for d in old.differences] == [("stateful-operators", CHECK)]
        assert accept(Checkpoint.open(base.checkpoint), old) is not None  # what `compat --record` does
        report = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: join_type_changed(s, base))
        assert [(d.aspect, d.verdict) for d in report.differences] == [("stateful-operators", SILENT)], report.render()
        unchanged = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: join_writer(s, base))
        assert unchanged.compatible and unchanged.differences == (), unchanged.render()
    finally:
        use_session_conf(spark)
        base.reset()


def test_after_a_rollback_the_query_is_judged_against_the_one_that_wrote_the_batch_rolled_back_to(spark, compat_bases):
    """The window length changed at batch 3 (recorded, as a Dagster run records a change it ran), then the
    checkpoint was rolled back to batch 2, which the original query wrote. The record of the changed query named
    batches the rollback removed, yet compat judged against it (a hostile review): the changed query again was
    "compatible, Spark already accepted it" with no word of the windows of both lengths it makes, and the
    original query was warned about "windows already in the state" that the rollback removed. Both are now
    judged against the query recorded before the change."""
    import subprocess
    import sys

    from checkpoint_ops.query_profile import describe_query, read_profile, record_profile

    base = compat_bases("agg")
    base.reset()
    use_session_conf(spark)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        before_change = base_batch(base)
        changed = window_length_changed(spark, base)
        profile = describe_query(spark, changed)
        base.add_events(3, 4)
        real = restart_for_real(spark, changed, base.checkpoint)
        assert real.ok, real.error
        fm, ckpt_root = open_file_manager(base.checkpoint)
        record_profile(fm, ckpt_root, profile, judged=False, batch=before_change)  # accepted after it ran
        assert read_profile(fm, ckpt_root).profile.to_dict() == profile.to_dict()
        rolled = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", base.checkpoint, "--to-batch",
                                 str(before_change), "--sink", base.output, "--yes", "--json"], cwd=root,
                                capture_output=True, text=True, timeout=600)
        assert rolled.returncode == 0, rolled.stderr

        original = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: counts_writer(
            s, base.dir("input"), base.output))
        assert original.compatible and not original.differences, original.render()
        again = check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: window_length_changed(s, base),
                             reuse_judged=True)
        assert ("stateful-operators", SILENT) in {(d.aspect, d.verdict) for d in again.differences}, again.render()
        assert not again.compatible and again.spark_restarts is True, again.render()  # judged, not "already accepted"
    finally:
        use_session_conf(spark)
        base.reset()


def test_a_query_recorded_before_the_checkpoint_existed_is_judged_once_another_query_created_it(spark, compat_bases):
    """Earlier releases recorded a Dagster run's query before the run, so at a new location with no query id (Spark
    had not created the checkpoint yet), also when the run was refused before its query started. Then another query,
    run with plain Spark, created the checkpoint there and committed. That record was taken for Spark's acceptance
    (review 2): the Dagster step (``reuse_judged``) skipped the restart and called a query Spark refuses
    "compatible, Spark already accepted it". It is judged now, and refused with Spark's error."""
    from checkpoint_ops.query_profile import describe_query, record_profile

    base = compat_bases("agg")
    base.reset()
    use_session_conf(spark)
    location, output = base.dir("elsewhere-checkpoint"), base.dir("elsewhere-output")

    def with_max(s):  # an aggregate more than the query that creates the checkpoint: Spark refuses its state
        return _to_parquet(_windowed(read_events(s, base.dir("input")), with_max=True), base, output=output)

    try:
        fm, root = open_file_manager(location)
        recorded = record_profile(fm, root, describe_query(spark, with_max(spark)), judged=False, batch=None)
        assert recorded.query_id is None and recorded.batch is None  # as the earlier release wrote it
        created = restart_for_real(spark, counts_writer(spark, base.dir("input"), output), location)
        assert created.ok and Checkpoint.open(location).latest_commit is not None, created.error

        report = check_compat(Checkpoint.open(location), spark, with_max, reuse_judged=True)
        assert report.spark_restarts is False and not report.compatible, report.render()
        assert [(d.aspect, d.verdict, d.error_class) for d in report.differences] == [
            ("state-schema", FAILS, "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE")], report.render()
        base.add_events(BASE_FILES_NEXT, BASE_FILES_NEXT + 1)
        real = restart_for_real(spark, with_max(spark), location)  # Spark's own answer agrees, at its next batch
        assert not real.ok and "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in real.error, real.error
    finally:
        use_session_conf(spark)
        base.reset()


def test_a_stateful_checkpoint_whose_state_directory_is_gone_is_named_before_spark_refuses_it(spark, compat_bases):
    """``state/`` deleted whole leaves no file to judge and (format V1) no commit naming an operator: fsck said
    "healthy", inspect "stateless", and the next run failed inside Spark (a hostile review). The query recorded
    as the one that wrote the last batch is stateful: fsck names ``state``, a rollback is refused, compat refuses
    to judge, and Spark fails to restart as fsck says."""
    from tests.helpers import cli_json

    base = compat_bases("agg")
    base.reset()
    use_session_conf(spark)
    try:
        # the next run records the query again, now with the checkpoint's query id (the first record was made
        # before Spark created the checkpoint): only a record made for this very checkpoint says it is stateful
        same = check_compat(Checkpoint.open(base.checkpoint), spark,
                            lambda s: counts_writer(s, base.dir("input"), base.output))
        assert accept(Checkpoint.open(base.checkpoint), same) is not None
        shutil.rmtree(os.path.join(base.checkpoint, "state"))
        before = tree_snapshot(base.root)
        code, f = cli_json("fsck", base.checkpoint, "--sink", base.output)
        named = [x for x in f["findings"] if x["code"] == "state-missing"]
        assert code == 1 and len(named) == 1 and named[0]["path"].endswith("/checkpoint/state"), f["findings"]
        assert "aggregation" in named[0]["problem"] and "query-profile.json" in named[0]["problem"], named[0]
        code, r = cli_json("rollback", base.checkpoint, "--to-batch", str(base_batch(base) - 1), "--sink", base.output,
                           "--dry-run")
        assert code == 2 and r["path"].endswith("/checkpoint/state"), r
        with pytest.raises(BadInputError) as refused:
            check_compat(Checkpoint.open(base.checkpoint), spark, lambda s: counts_writer(s, base.dir("input"),
                                                                                          base.output))
        assert refused.value.path.endswith("/checkpoint/state"), refused.value.render()
        assert tree_snapshot(base.root) == before
        base.add_events(3, 4)
        real = restart_for_real(spark, counts_writer(spark, base.dir("input"), base.output), base.checkpoint)
        assert real.error is not None and "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY" in real.error, real.error
    finally:
        use_session_conf(spark)
        base.reset()
