"""Benchmark: what wrapping a streaming query as a Dagster asset costs.

The same query (``pipelines.event_counts.events_writer``: JSON files -> parquet file sink, one file per
micro-batch) over the same amount of new input (``--new`` files, so ``--new`` micro-batches), run

* (a) by a plain PySpark script: ``writer.option("checkpointLocation", ...).trigger(availableNow=True)
  .start().awaitTermination()``;
* (b) as a materialization of the asset ``streaming_definitions`` makes of it: the asset's job through
  ``execute_in_process`` on a persistent (SQLite) instance: the lease, the run, the ledger sync, inspect
  for the metadata, and the asset's checks (``checkpoint_health_check``: fsck; ``backup_freshness_check``).

Both run in one process on one Spark session and on the same checkpoint, taking turns (the order alternates
each round), so each measures the same checkpoint size. Spark wrote the checkpoints: one retaining 10
batches and one retaining 1,000 (``minBatchesToRetain``, which also keeps that many source- and sink-log
files: 100 compact files each), so the overhead can be seen to stay flat as the checkpoint grows, or not.

Usage: ``python benchmarks/asset_overhead.py [--sizes 10,1000] [--new 10] [--rounds 5] [--dir D]``
Prints a markdown report (recorded in docs/benchmarks.md).
"""

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

import dagster as dg  # noqa: E402

from pipelines.event_counts import events_writer, write_event_files  # noqa: E402
from dagster_checkpoint_ops.streaming import StreamingQuery, streaming_definitions  # noqa: E402
from dagster_checkpoint_ops.resources.spark import LOCAL_SPARK  # noqa: E402

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
RETAIN = "spark.sql.streaming.minBatchesToRetain"


class Stream:
    """One checkpoint retaining ``size`` batches, its input and output, and both ways to run it."""

    def __init__(self, spark, root: str, size: int, instance):
        self.spark, self.size, self.instance = spark, size, instance
        self.input, self.output = os.path.join(root, "input"), os.path.join(root, "output")
        self.checkpoint = os.path.join(root, "checkpoint")
        self.next_file = 0
        self.conf = {**LOCAL_SPARK, RETAIN: str(size)}
        query = StreamingQuery(name=f"events_{size}", checkpoint=self.checkpoint, sinks=[self.output],
                               build=lambda s: events_writer(s, self.input, self.output))
        self.defs = streaming_definitions([query], home=os.path.join(root, "home"), spark_config=self.conf)
        self.job = self.defs.resolve_job_def(f"{query.name}_job")
        self.asset = query.name

    def land(self, n: int) -> None:
        write_event_files(self.input, self.next_file, self.next_file + n)
        self.next_file += n

    def plain(self) -> float:
        t = time.perf_counter()
        for k, v in self.conf.items():
            if k.startswith("spark.sql."):
                self.spark.conf.set(k, v)
        q = events_writer(self.spark, self.input, self.output).option("checkpointLocation", self.checkpoint) \
            .trigger(availableNow=True).start()
        q.awaitTermination()
        return time.perf_counter() - t

    def asset_run(self) -> tuple[float, float]:
        t = time.perf_counter()
        r = self.job.execute_in_process(instance=self.instance, run_config=QUIET)
        wall = time.perf_counter() - t
        assert r.success
        (mat,) = r.asset_materializations_for_node(self.asset)
        return wall, mat.metadata["duration_s"].value

    def retained(self) -> int:
        return len([n for n in os.listdir(os.path.join(self.checkpoint, "commits")) if n.isdigit()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,1000", help="retained batches of each checkpoint")
    ap.add_argument("--new", type=int, default=10, help="new input files (micro-batches) per run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("asset-overhead")
    for k, v in LOCAL_SPARK.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    work = args.dir or tempfile.mkdtemp(prefix="asset-overhead-")
    os.makedirs(os.path.join(work, "dagster"), exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    loads = {}  # 1-minute load average when each size finished (the machine is shared)
    try:
        with dg.DagsterInstance.local_temp(tempdir=os.path.join(work, "dagster"),
                                           overrides={"telemetry": {"enabled": False}}) as instance:
            for size in sizes:
                s = Stream(spark, os.path.join(work, f"retain-{size}"), size, instance)
                t = time.perf_counter()
                s.land(size)  # Spark writes the checkpoint: one batch per file
                s.plain()
                print(f"[{size}] Spark wrote {s.retained()} batches in {time.perf_counter() - t:.0f} s",
                      file=sys.stderr, flush=True)
                s.land(args.new)  # warm-up of both paths (JIT, Dagster's first-run costs), not measured
                s.asset_run()
                s.land(args.new)
                s.plain()
                plain, asset, inner = [], [], []
                for r in range(args.rounds):
                    for way in (("plain", "asset") if r % 2 == 0 else ("asset", "plain")):
                        s.land(args.new)
                        if way == "plain":
                            plain.append(s.plain())
                        else:
                            wall, duration = s.asset_run()
                            asset.append(wall)
                            inner.append(duration)
                    print(f"[{size}] round {r + 1}: plain {plain[-1]:.2f} s, asset {asset[-1]:.2f} s",
                          file=sys.stderr, flush=True)
                results[size] = (s.retained(), plain, asset, inner)
                loads[size] = os.getloadavg()[0]
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    print(f"`python benchmarks/asset_overhead.py --sizes {args.sizes} --new {args.new} --rounds {args.rounds}` "
          f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}); medians of "
          f"{args.rounds} runs of each, {args.new} new micro-batches per run:\n")
    print("| retained batches | (a) plain PySpark script, s | (b) asset materialization (job), s | (b) / (a) "
          "| of which the asset step, s | target ≤ 1.15x | load average |")
    print("|---|---|---|---|---|---|---|")
    for size, (retained, plain, asset, inner) in results.items():
        a, b = statistics.median(plain), statistics.median(asset)
        print(f"| {retained:,} | {a:.2f} | {b:.2f} | **{b / a:.2f}x** | {statistics.median(inner):.2f} "
              f"| {'met' if b / a <= 1.15 else 'not met'} | {loads[size]:.1f} |")
    print()
    for size, (retained, plain, asset, _) in results.items():
        print(f"All runs at {retained:,}: plain " + ", ".join(f"{x:.2f}" for x in plain)
              + " / asset " + ", ".join(f"{x:.2f}" for x in asset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
