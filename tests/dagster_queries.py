"""Streaming queries the Dagster tests wrap with the factory, and their expected output.

``counts``: windowed counts into a parquet file sink (RocksDB, changelog, checkpoint format V2).
``totals``: running totals per key written by foreachBatch, idempotent per batch id (HDFS state store).
"""

from __future__ import annotations

import os
from collections import defaultdict

from pipelines.event_counts import KEYS, ROWS_PER_FILE, counts_writer, read_events
from dagster_checkpoint_ops.streaming import StreamingQuery
from tests.spark_runs import FLAVOURS


def counts_query(base: str, name: str = "counts", flavour: str = "rocksdb_v2") -> StreamingQuery:
    inp, out = os.path.join(base, "input"), os.path.join(base, "output")

    def build(spark):
        for k, v in FLAVOURS[flavour].items():
            spark.conf.set(k, v)
        return counts_writer(spark, inp, out)

    return StreamingQuery(name=name, build=build, checkpoint=os.path.join(base, "checkpoint"), sinks=[out])


def totals_query(base: str, name: str = "totals") -> StreamingQuery:
    inp, out = os.path.join(base, "input"), os.path.join(base, "output")

    def build(spark):
        from pyspark.sql import functions as F

        for k, v in FLAVOURS["hdfs"].items():
            spark.conf.set(k, v)
        totals = read_events(spark, inp).groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))

        def write_batch(df, batch_id):  # idempotent: a re-run batch replaces its own output
            df.write.mode("overwrite").parquet(os.path.join(out, f"batch-{batch_id:05d}"))

        return totals.writeStream.outputMode("update").foreachBatch(write_batch)

    return StreamingQuery(name=name, build=build, checkpoint=os.path.join(base, "checkpoint"))


def read_totals(spark, output_dir: str, last_batch: int) -> dict[str, tuple[int, int]]:
    """key -> (count, sum) as of ``last_batch``: each key's row from the newest batch that updated it."""
    latest: dict = {}
    for name in sorted(os.listdir(output_dir)):
        batch = int(name.split("-")[1])
        if batch <= last_batch:
            for r in spark.read.parquet(os.path.join(output_dir, name)).collect():
                latest[r["key"]] = (r["n"], r["total"])
    return latest


def expected_totals(file_indexes) -> dict[str, tuple[int, int]]:
    n, total = defaultdict(int), defaultdict(int)
    for i in file_indexes:
        for j in range(ROWS_PER_FILE):
            n[f"k{j % KEYS}"] += 1
            total[f"k{j % KEYS}"] += i * 10 + j
    return {k: (n[k], total[k]) for k in n}
