"""The example streaming queries: JSON event files -> the events as parquet, and windowed counts and sums.

Pure PySpark (no Dagster), so the example definitions, the demo and the tests run exactly the same queries.

Input file ``i`` holds ``ROWS_PER_FILE`` events with event times ``10*i + j`` seconds, so a
30-second window spans three files and state really carries over between batches. Files get
distinct, increasing modification times: the file source orders by mtime, and equal mtimes would
make the batch boundaries (and therefore late data) nondeterministic.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from datetime import datetime, timezone

ROWS_PER_FILE = 5
KEYS = 3
WINDOW_SECONDS = 30
FILE_MTIME_BASE = 1_700_000_000
FLUSH_KEY = "flush"
# Event time far beyond the data: two flush files close every real window (see flush_files).
FLUSH_TIME_S = 10**6


def _iso(seconds: int) -> str:
    # An explicit "Z" keeps parsing independent of the session time zone.
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_rows(index: int) -> list[dict]:
    return [
        {
            "key": f"k{j % KEYS}",
            "value": index * 10 + j,
            "ts": _iso(index * 10 + j),
        }
        for j in range(ROWS_PER_FILE)
    ]


def _write(input_dir: str, name: str, rows: list[dict], mtime: int) -> str:
    os.makedirs(input_dir, exist_ok=True)
    path = os.path.join(input_dir, name)
    tmp = os.path.join(input_dir, f".{name}.tmp")  # hidden: the file source ignores it
    with open(tmp, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    os.utime(tmp, (mtime, mtime))
    os.rename(tmp, path)
    return path


def write_event_files(input_dir: str, start: int, stop: int) -> list[str]:
    """Write input files ``start..stop-1`` (each becomes one micro-batch at maxFilesPerTrigger=1)."""
    return [_write(input_dir, f"events-{i:05d}.json", event_rows(i), FILE_MTIME_BASE + i) for i in range(start, stop)]


def write_bad_event_file(input_dir: str, index: int, factor: int = 1000) -> str:
    """Input file ``index`` as a bad upstream delivery: every value ``factor`` times too large.

    ``write_event_files(input_dir, index, index + 1)`` later writes the corrected file in its place,
    with the same modification time, so reprocessing selects it in the same order.
    """
    rows = [dict(r, value=r["value"] * factor) for r in event_rows(index)]
    return _write(input_dir, f"events-{index:05d}.json", rows, FILE_MTIME_BASE + index)


def flush_files(input_dir: str, after_index: int) -> list[str]:
    """Two files with far-future event times: processing the second evicts every real window."""
    out = []
    for n in range(2):
        out.append(_write(input_dir, f"flush-{n}.json", [{"key": FLUSH_KEY, "value": 0, "ts": _iso(FLUSH_TIME_S + 100 * n)}],
                          FILE_MTIME_BASE + after_index + 1 + n))
    return out


def expected_windows(file_indexes, scale_for=lambda index: 1) -> dict[tuple[int, str], tuple[int, int]]:
    """(window start seconds, key) -> (count, sum) over the given input files.

    ``scale_for(i)`` is the multiplier the query applied to file i's values (to model a logic change).
    """
    counts: Counter = Counter()
    sums: dict = defaultdict(int)
    for i in file_indexes:
        for j in range(ROWS_PER_FILE):
            event_time, key, value = i * 10 + j, f"k{j % KEYS}", i * 10 + j
            w = event_time // WINDOW_SECONDS * WINDOW_SECONDS
            counts[(w, key)] += 1
            sums[(w, key)] += value * scale_for(i)
    return {k: (counts[k], sums[k]) for k in counts}


# The aggregation keeps its state in RocksDB (changelog on) with checkpoint format V2. These are
# session settings Spark records in the checkpoint at its first batch; later runs use the recorded ones.
ROCKSDB_V2 = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
}


def event_schema():
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("key", T.StringType()),
        T.StructField("value", T.LongType()),
        T.StructField("ts", T.TimestampType()),
    ])


def read_events(spark, input_dir: str, max_files_per_trigger: int = 1):
    """The JSON event files of ``input_dir`` as a stream (one file per micro-batch by default)."""
    return spark.readStream.schema(event_schema()).option("maxFilesPerTrigger", max_files_per_trigger).json(input_dir)


def windowed_counts(events, value_scale: int = 1):
    """Per 30-second window and key: count and sum of values, emitted when the watermark passes the window."""
    from pyspark.sql import functions as F

    if value_scale != 1:
        events = events.withColumn("value", F.col("value") * F.lit(value_scale))
    return (
        events.withWatermark("ts", "0 seconds")
        .groupBy(F.window("ts", f"{WINDOW_SECONDS} seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.col("window.start").alias("window_start"), "key", "n", "total")
    )


def events_writer(spark, input_dir: str, output_dir: str):
    """Unstarted writer: the events as they arrive -> parquet in ``output_dir`` (stateless)."""
    return read_events(spark, input_dir).writeStream.format("parquet").option("path", output_dir)


def counts_writer(spark, input_dir: str, output_dir: str, value_scale: int = 1):
    """Unstarted writer: windowed counts -> parquet in ``output_dir`` (append mode, stateful)."""
    counts = windowed_counts(read_events(spark, input_dir), value_scale)
    return counts.writeStream.format("parquet").outputMode("append").option("path", output_dir)


def build_query(spark, input_dir: str, output_dir: str, checkpoint_dir: str, *, value_scale: int = 1,
                available_now: bool = True, query_name: str | None = None):
    """Start the windowed-counts query on ``checkpoint_dir``; returns the StreamingQuery.

    ``value_scale`` multiplies values before aggregation: changing it is a logic change that keeps
    the state schema compatible.
    """
    writer = counts_writer(spark, input_dir, output_dir, value_scale).option("checkpointLocation", checkpoint_dir)
    if query_name:
        writer = writer.queryName(query_name)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="1 second")
    return writer.start()


def read_output(spark, output_dir: str) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """Sink rows through the sink log (as any Spark reader sees them), keyed by (window, key).

    Values are lists so duplicates stay visible.
    """
    rows = (
        spark.read.parquet(output_dir)
        .selectExpr("CAST(unix_timestamp(window_start) AS BIGINT) AS w", "key", "n", "total")
        .collect()
    )
    out: dict = defaultdict(list)
    for r in rows:
        if r["key"] != FLUSH_KEY:
            out[(r["w"], r["key"])].append((r["n"], r["total"]))
    return dict(out)
