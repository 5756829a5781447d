"""Real Spark runs of every stateful operator PySpark 4.3 offers, for the operator tests.

Each ``OperatorQuery`` is a small query over deterministic JSON input files with explicit event times:
file ``i`` of every source is one micro-batch (``maxFilesPerTrigger=1``) with event times ``10*i + j``
seconds, so watermarks, outer-join null rows, timeouts and timers fire at the same batches however
often the query is stopped, rolled back and resumed. Two flush files per source (event times far
beyond the data) close everything at the end, so the final output of a run is complete.

A checkpoint is generated once per (query, state store) and kept pristine, like ``spark_runs.py``:
two query runs (a restart in between, so transformWithState writes its operator metadata again), with
retention and compaction intervals small enough that Spark purges, compacts and cleans up within 9
batches. The *reference* is the uninterrupted run: the pristine checkpoint resumed with the flush
files; it must also equal the output worked out here in Python, so a query that misbehaves cannot
pass for a reference.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from pipelines.event_counts import _write  # hidden temp file, mtime set, then renamed into place
from tests.spark_runs import FLAVOURS, SESSION_CONF, SparkRun, unload_state_stores

FILE_MTIME_BASE = 1_700_000_000
FLUSH_KEY_PREFIX = "flush"
EVENT_BASE_S = 3600  # event times start here: an event at the epoch equals the initial watermark (0) and is dropped as late
FLUSH_TIME_S = 10**6
FILES_PER_RUN = (4, 3)  # two query runs: 7 input files per source, 9 batches (each run ends with a no-data batch)
# Retention and compaction small enough that 9 batches purge offsets and state and compact and clean the logs.
COMPACT_INTERVAL = 3  # of the file-source and file-sink logs: compactions at batches 2, 5 and 8
OPERATOR_CONF = {
    "spark.sql.streaming.minBatchesToRetain": "5",
    "spark.sql.streaming.fileSink.log.compactInterval": str(COMPACT_INTERVAL),
    "spark.sql.streaming.fileSource.log.compactInterval": str(COMPACT_INTERVAL),
}
ROCKSDB_FLAVOURS = ("rocksdb", "rocksdb_v2")
ALL_FLAVOURS = ("hdfs", "rocksdb", "rocksdb_v2")

Row = tuple  # one output row, normalised (timestamps as epoch seconds), compared as a sorted list


def iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def at(offset_s: int) -> str:
    """The event time ``offset_s`` seconds into the data, as the input files spell it."""
    return iso(EVENT_BASE_S + offset_s)


def _events(spark, path: str):
    return spark.readStream.schema("key STRING, value LONG, ts TIMESTAMP").option("maxFilesPerTrigger", 1).json(path)


# ---- the queries: build (spark, {source: input dir}) -> streaming DataFrame ------------------------------


def _join(how: str):
    def build(spark, inputs):
        from pyspark.sql import functions as F

        left = _events(spark, inputs["left"]).withWatermark("ts", "10 seconds").alias("l")
        right = _events(spark, inputs["right"]).withWatermark("ts", "10 seconds").alias("r")
        cond = F.expr("l.key = r.key AND r.ts BETWEEN l.ts AND l.ts + interval 5 seconds")
        return left.join(right, cond, how).select(F.col("l.key").alias("key"), F.col("l.value").alias("left_value"),
                                                  F.col("r.value").alias("right_value"))

    return build


def _join_rows(source: str, i: int) -> list[dict]:
    """Left file i: keys k0..k2. Right file i: the matches of left file i-1's k0 and k1, one batch
    late (the join must keep left rows in state); k2 never matches (left outer emits it with nulls)."""
    if source == "left":
        return [{"key": f"k{j}", "value": 100 * i + j, "ts": at(10 * i + j)} for j in range(3)]
    if i == 0:
        return [{"key": "right-only", "value": 1000, "ts": at(0)}]
    return [{"key": f"k{j}", "value": 1000 + 100 * (i - 1) + j, "ts": at(10 * (i - 1) + j + 1)} for j in range(2)]


def _join_expected(how: str):
    def expected(files: int) -> list[Row]:
        rows = []
        for i in range(files):
            for j in range(3):
                matched = j < 2 and i + 1 < files
                if matched:
                    rows.append((f"k{j}", 100 * i + j, 1000 + 100 * i + j))
                elif how == "left_outer":
                    rows.append((f"k{j}", 100 * i + j, None))
        return sorted(rows, key=_sort_key)

    return expected


def _dedup(spark, inputs):
    return _events(spark, inputs["events"]).withWatermark("ts", "10 seconds").dropDuplicates(["key", "ts"]) \
        .select("key", "value", "ts")


def _dedup_rows(source: str, i: int) -> list[dict]:
    """Three events, and the first two of the previous file again (same key and event time)."""
    rows = [{"key": f"e{i}-{j}", "value": 10 * i + j, "ts": at(10 * i + j)} for j in range(3)]
    if i > 0:
        rows += [{"key": f"e{i - 1}-{j}", "value": 10 * (i - 1) + j, "ts": at(10 * (i - 1) + j)} for j in range(2)]
    return rows


def _dedup_expected(files: int) -> list[Row]:
    return sorted(((f"e{i}-{j}", 10 * i + j, EVENT_BASE_S + 10 * i + j) for i in range(files) for j in range(3)),
                  key=_sort_key)


def _dedup_within(spark, inputs):
    return _events(spark, inputs["events"]).withWatermark("ts", "20 seconds") \
        .dropDuplicatesWithinWatermark(["key"]).select("key", "value", "ts")


def _dedup_within_rows(source: str, i: int) -> list[dict]:
    """Three events, and the first two of the previous file again with a later event time and
    another value: duplicates by key within the watermark delay."""
    rows = [{"key": f"e{i}-{j}", "value": 10 * i + j, "ts": at(10 * i + j)} for j in range(3)]
    if i > 0:
        rows += [{"key": f"e{i - 1}-{j}", "value": -1, "ts": at(10 * (i - 1) + j + 8)} for j in range(2)]
    return rows


def _session(spark, inputs):
    from pyspark.sql import functions as F

    return (_events(spark, inputs["events"]).withWatermark("ts", "10 seconds")
            .groupBy(F.session_window("ts", "5 seconds"), "key")
            .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
            .select("key", F.col("session_window.start").alias("start"), F.col("session_window.end").alias("end"),
                    "n", "total"))


def _session_rows(source: str, i: int) -> list[dict]:
    """s0: an event every 3-4 seconds (one session across every batch); s1: one event in every other
    file (a session of its own each time)."""
    rows = [{"key": "s0", "value": 10 * i + d, "ts": at(10 * i + d)} for d in (0, 3, 6)]
    if i % 2 == 0:
        rows.append({"key": "s1", "value": 10 * i + 1, "ts": at(10 * i + 1)})
    return rows


def _session_expected(files: int) -> list[Row]:
    s0 = [10 * i + d for i in range(files) for d in (0, 3, 6)]
    rows = [("s0", EVENT_BASE_S, EVENT_BASE_S + max(s0) + 5, len(s0), sum(s0))]
    rows += [("s1", EVENT_BASE_S + 10 * i + 1, EVENT_BASE_S + 10 * i + 6, 1, 10 * i + 1) for i in range(0, files, 2)]
    return sorted(rows, key=_sort_key)


def _timeout_rows(source: str, i: int) -> list[dict]:
    """a: events in every file (its timeout never fires before the flush); b: an event in every
    fourth file (its timeout fires three batches later, before b's next event)."""
    rows = [{"key": "a", "value": 10 * i + d, "ts": at(10 * i + d)} for d in (0, 5)]
    if i % 4 == 0:
        rows.append({"key": "b", "value": 10 * i + 2, "ts": at(10 * i + 2)})
    return rows


def _apply_in_pandas_with_state(spark, inputs):
    from pyspark.sql.streaming.state import GroupStateTimeout

    return (_events(spark, inputs["events"]).withWatermark("ts", "10 seconds").groupBy("key")
            .applyInPandasWithState(_count_until_timeout, "key STRING, n LONG, total LONG", "n LONG, total LONG",
                                    "append", GroupStateTimeout.EventTimeTimeout))


def _count_until_timeout(key, frames, state):
    """Count and sum a key's events; emit them when its event-time timeout (last event + 5 s) fires."""
    import pandas as pd

    if state.hasTimedOut:
        n, total = state.get
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "n": [n], "total": [total]})
        return
    n, total = state.get if state.exists else (0, 0)
    newest = 0
    for frame in frames:
        n += len(frame)
        total += int(frame["value"].sum())
        newest = max(newest, int(frame["ts"].max().timestamp() * 1000))
    state.update((n, total))
    state.setTimeoutTimestamp(newest + 5000)
    yield pd.DataFrame({"key": pd.Series([], dtype=str), "n": pd.Series([], dtype="int64"),
                        "total": pd.Series([], dtype="int64")})


def _timeout_expected(with_parities: bool):
    def expected(files: int) -> list[Row]:
        a = [10 * i + d for i in range(files) for d in (0, 5)]
        rows = [("a", len(a), sum(a), *((len({v % 2 for v in a}),) if with_parities else ()))]
        rows += [("b", 1, 10 * i + 2, *((1,) if with_parities else ())) for i in range(0, files, 4)]
        return sorted(rows, key=_sort_key)

    return expected


def _transform_with_state(spark, inputs):
    return (_events(spark, inputs["events"]).withWatermark("ts", "10 seconds").groupBy("key")
            .transformWithStateInPandas(_processor(), "key STRING, n LONG, total LONG, parities LONG", "Append",
                                        "EventTime"))


def _processor():
    """A StatefulProcessor with value, list and map state and an event-time timer (last event + 5 s):
    when the timer fires it emits the key's count, the sum of its values and how many parities it saw."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class CountUntilTimer(StatefulProcessor):
        def init(self, handle):
            self.handle = handle
            self.count = handle.getValueState("count", "n LONG")
            self.values = handle.getListState("values", "v LONG")
            self.parities = handle.getMapState("parities", "parity STRING", "seen LONG")

        def handleInputRows(self, key, rows, timerValues):
            n = self.count.get()[0] if self.count.exists() else 0
            newest = 0
            for frame in rows:
                n += len(frame)
                for v in frame["value"]:
                    self.values.appendValue((int(v),))
                    parity = ("even", "odd")[int(v) % 2]
                    seen = self.parities.getValue((parity,))
                    self.parities.updateValue((parity,), ((seen[0] if seen else 0) + 1,))
                newest = max(newest, int(frame["ts"].max().timestamp() * 1000))
            self.count.update((n,))
            for t in list(self.handle.listTimers()):
                self.handle.deleteTimer(t)
            self.handle.registerTimer(newest + 5000)
            return iter([])

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            n = self.count.get()[0]
            total = sum(v[0] for v in self.values.get())
            parities = len(list(self.parities.keys()))
            self.count.clear()
            self.values.clear()
            self.parities.clear()
            yield pd.DataFrame({"key": [key[0]], "n": [n], "total": [total], "parities": [parities]})

    return CountUntilTimer()


def _chained(spark, inputs):
    from pyspark.sql import functions as F

    return (_events(spark, inputs["events"]).withWatermark("ts", "10 seconds").dropDuplicates(["key", "ts"])
            .groupBy(F.window("ts", "30 seconds"), "key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
            .select(F.col("window.start").alias("window_start"), "key", "n", "total"))


def _chained_rows(source: str, i: int) -> list[dict]:
    rows = [{"key": f"k{j % 2}", "value": 10 * i + j, "ts": at(10 * i + j)} for j in range(3)]
    if i > 0:
        rows += [{"key": f"k{j % 2}", "value": 10 * (i - 1) + j, "ts": at(10 * (i - 1) + j)} for j in range(2)]
    return rows


def _chained_expected(files: int) -> list[Row]:
    acc: dict = defaultdict(lambda: [0, 0])
    for i in range(files):
        for j in range(3):
            cell = acc[(EVENT_BASE_S + (10 * i + j) // 30 * 30, f"k{j % 2}")]
            cell[0] += 1
            cell[1] += 10 * i + j
    return sorted(((w, k, n, total) for (w, k), (n, total) in acc.items()), key=_sort_key)


@dataclass(frozen=True)
class OperatorQuery:
    """One stateful query of the operator tests: how to build it, its input, what it must output."""

    name: str
    build: Callable  # (spark, {source: input dir}) -> streaming DataFrame (append mode)
    rows: Callable[[str, int], list[dict]]  # (source, file index) -> the events of that input file
    expected: Callable[[int], list[Row]]  # number of input files -> the complete output, sorted
    operators: tuple[str, ...]  # operator names Spark records in the operator metadata, by operator id
    stores: tuple[str, ...] = ("default",)  # store names of operator 0
    sources: tuple[str, ...] = ("events",)
    flavours: tuple[str, ...] = ALL_FLAVOURS  # the state stores Spark allows for it


QUERIES = {q.name: q for q in [
    OperatorQuery("join_inner", _join("inner"), _join_rows, _join_expected("inner"), ("symmetricHashJoin",),
                  ("left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues",
                   "right-keyWithIndexToValue"), ("left", "right")),
    OperatorQuery("join_left_outer", _join("left_outer"), _join_rows, _join_expected("left_outer"),
                  ("symmetricHashJoin",), ("left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues",
                                           "right-keyWithIndexToValue"), ("left", "right")),
    OperatorQuery("drop_duplicates", _dedup, _dedup_rows, _dedup_expected, ("dedupe",)),
    OperatorQuery("drop_duplicates_within_watermark", _dedup_within, _dedup_within_rows, _dedup_expected,
                  ("dedupeWithinWatermark",)),
    OperatorQuery("session_window", _session, _session_rows, _session_expected, ("sessionWindowStateStoreSaveExec",)),
    OperatorQuery("apply_in_pandas_with_state", _apply_in_pandas_with_state, _timeout_rows, _timeout_expected(False),
                  ("applyInPandasWithState",)),
    OperatorQuery("transform_with_state_in_pandas", _transform_with_state, _timeout_rows, _timeout_expected(True),
                  ("transformWithStateInPandasExec",), flavours=ROCKSDB_FLAVOURS),
    OperatorQuery("dedup_then_window", _chained, _chained_rows, _chained_expected, ("stateStoreSave", "dedupe")),
]}


def _sort_key(row: Row) -> tuple:
    return tuple((v is None, v if v is not None else 0) for v in row)


# ---- one generated checkpoint --------------------------------------------------------------------------


@dataclass
class OperatorRun(SparkRun):
    """A checkpoint (and file sink) of one operator query on one state store, kept pristine."""

    query: OperatorQuery | None = None
    reference: list[Row] = field(default_factory=list)  # the output of the uninterrupted run
    restart_batch: int | None = None  # the first batch of the second query run

    def input_dir(self, source: str) -> str:
        return os.path.join(self.input, source)

    def write_files(self, start: int, stop: int) -> None:
        for source in self.query.sources:
            for i in range(start, stop):
                _write(self.input_dir(source), f"part-{i:05d}.json", self.query.rows(source, i), FILE_MTIME_BASE + i)

    def write_flush_files(self, inputs: str | None = None) -> None:
        """Two files per source far beyond the data: after the second the watermark closes everything."""
        for source in self.query.sources:
            for n in range(2):
                _write(os.path.join(inputs or self.input, source), f"flush-{n}.json",
                       [{"key": f"{FLUSH_KEY_PREFIX}-{source}", "value": 0, "ts": iso(FLUSH_TIME_S + 100 * n)}],
                       FILE_MTIME_BASE + self.files + 1 + n)

    def run_query(self, spark, conf: dict | None = None, checkpoint: str | None = None, output: str | None = None,
                  inputs: str | None = None) -> list[dict]:
        """Run the query (availableNow) to the end of its input; returns the progress of each batch.
        ``checkpoint``, ``output`` and ``inputs`` point it elsewhere (a restored copy)."""
        for k, v in {**SESSION_CONF, **OPERATOR_CONF, **FLAVOURS[self.flavour], **(conf or {})}.items():
            if k.startswith("spark.sql."):
                spark.conf.set(k, v)
        base_in = inputs or self.input
        df = self.query.build(spark, {s: os.path.join(base_in, s) for s in self.query.sources})
        q = (df.writeStream.format("parquet").outputMode("append")
             .option("checkpointLocation", checkpoint or self.checkpoint)
             .trigger(availableNow=True).start(output or self.output))
        try:
            q.awaitTermination()
        finally:
            unload_state_stores(spark)
        return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]

    def read_output(self, spark, output: str | None = None) -> list[Row]:
        """The sink's rows through Spark's reader (its log), flush rows left out, sorted; duplicates stay.
        Timestamps become epoch seconds in Spark (the Python conversion would use the local time zone)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import TimestampType

        df = spark.read.parquet(output or self.output)
        df = df.select(*[F.col(f.name).cast("long").alias(f.name) if isinstance(f.dataType, TimestampType)
                         else F.col(f.name) for f in df.schema.fields])
        rows = [tuple(r) for r in df.collect() if not str(r["key"]).startswith(FLUSH_KEY_PREFIX)]
        return sorted(rows, key=_sort_key)

    def resume_and_read(self, spark, checkpoint: str | None = None, output: str | None = None,
                        inputs: str | None = None) -> list[Row]:
        """Add the flush files, let Spark resume to the end, and read the sink."""
        self.write_flush_files(inputs)
        progress = self.run_query(spark, checkpoint=checkpoint, output=output, inputs=inputs)
        assert progress, "Spark ran no batch"
        return self.read_output(spark, output)

def generate_operator_run(spark, query: OperatorQuery, flavour: str, base: str) -> OperatorRun:
    """Two query runs over the input, then the reference: the pristine copy resumed with the flush
    files (checked against the Python expectation), then the pristine tree put back."""
    run = OperatorRun(flavour, base, query=query)
    os.makedirs(base)
    start = 0
    for n in FILES_PER_RUN:
        run.write_files(start, start + n)
        start += n
        run.files = start
        if run.progress:
            run.restart_batch = run.last_batch + 1
        run.progress += run.run_query(spark)
    time.sleep(0.1)
    shutil.copytree(base, run.pristine, symlinks=True)
    run.reference = run.resume_and_read(spark)
    expected = query.expected(run.files)
    assert run.reference == expected, (f"{query.name} on {flavour}: the uninterrupted run's output is not what the "
                                       f"query must produce:\n{run.reference}\n!=\n{expected}")
    run.reset()
    return run
