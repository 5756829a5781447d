"""What Spark does with a ``commits/N`` cut to its version line, which fsck calls a torn write.

``parse_commit`` (checkpoint_ops/model/commits.py) refuses such a file as ``truncated-log-file``: Spark writes the
metadata line in every commit, and reads a missing one as ``{}``. The refusal says what that costs; this proves it
with Spark: from the cut file Spark resumes, without a word, with the watermark the batch ran with instead of the
later one it committed, so the next batch is judged against an older watermark than it would have been; in
checkpoint format V2 the cut commit names no state to load, and Spark's restart fails until a rollback.
"""

from __future__ import annotations

import json
import os
from datetime import datetime

from pipelines.event_counts import write_event_files
from tests.helpers import cli_json
from tests.spark_runs import COMPACT_INTERVAL

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))


def _watermark_ms(progress: dict) -> int:
    wm = progress["eventTime"]["watermark"]
    return int(datetime.fromisoformat(wm.replace("Z", "+00:00")).timestamp() * 1000)


def _metadata(path: str) -> dict:
    return json.loads(open(path, "rb").read().split(b"\n")[1])


def test_spark_resumes_from_a_commit_cut_to_its_version_line_with_the_batchs_own_watermark(spark, spark_runs):
    run = spark_runs("hdfs")

    def first_batch_watermark(cut: bool) -> tuple[int, int, int]:
        """From the pristine run: one batch of new input that moves the watermark on (no no-data batch after it,
        so it is the last one), its commit cut to its version line or not, then one more batch of new input.
        (watermark the moving batch ran with, the one it committed, the next batch's)."""
        run.reset()
        write_event_files(run.input, run.files, run.files + 1)
        (moved,) = [p for p in run.run_query(spark, conf={"spark.sql.streaming.noDataMicroBatches.enabled": "false"})]
        n = moved["batchId"]
        commit = os.path.join(run.checkpoint, "commits", str(n))
        ran_with = _metadata(os.path.join(run.checkpoint, "offsets", str(n)))["batchWatermarkMs"]
        committed = _metadata(commit)["nextBatchWatermarkMs"]
        if cut:
            with open(commit, "wb") as f:
                f.write(b"v1\n")
            os.remove(os.path.join(run.checkpoint, "commits", f".{n}.crc"))  # else Spark's checksum check refuses it
            code, r = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
            assert code != 0 and [f["code"] for f in r["findings"] if f["path"].endswith(f"commits/{n}")] == [
                "truncated-log-file"], r
        write_event_files(run.input, run.files + 1, run.files + 2)
        progress = run.run_query(spark)
        assert progress[0]["batchId"] == n + 1, progress[0]  # no error: Spark takes the cut file as batch n committed
        return ran_with, committed, _watermark_ms(progress[0])

    try:
        ran_with, committed, next_batch = first_batch_watermark(cut=False)
        assert committed > ran_with, (ran_with, committed)  # the batch moved the watermark on: the two tell apart
        assert next_batch == committed
        assert first_batch_watermark(cut=True) == (ran_with, committed, ran_with)
    finally:
        run.reset()


def test_a_commit_cut_to_its_version_line_in_format_v2_fails_spark_until_rolled_back(spark, spark_runs):
    """Checkpoint format V2: a commit keeps the ids of the state each operator's partitions load next. Cut to its
    version line, it holds none, and Spark's restart fails to load the state (CANNOT_LOAD_STATE_STORE), as the
    refusal says. A rollback to the batch before it (whose commit names that batch's state) lets Spark run the cut
    batch again and go on."""
    from pyspark.errors import StreamingQueryException

    run = spark_runs("rocksdb_v2")
    try:
        run.reset()
        write_event_files(run.input, run.files, run.files + 1)
        (moved,) = run.run_query(spark, conf={"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
        n = moved["batchId"]
        assert _metadata(os.path.join(run.checkpoint, "commits", str(n))).get("stateUniqueIds"), "not format V2"
        with open(os.path.join(run.checkpoint, "commits", str(n)), "wb") as f:
            f.write(b"v1\n")
        os.remove(os.path.join(run.checkpoint, "commits", f".{n}.crc"))
        code, r = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        (finding,) = [f for f in r["findings"] if f["path"].endswith(f"commits/{n}")]
        assert finding["code"] == "truncated-log-file" and "CANNOT_LOAD_STATE_STORE" in finding["problem"], finding
        write_event_files(run.input, run.files + 1, run.files + 2)
        try:
            run.run_query(spark)
            raise AssertionError("Spark restarted from a format V2 commit cut to its version line")
        except StreamingQueryException as e:
            assert "CANNOT_LOAD_STATE_STORE" in str(e), str(e)[:2000]

        # --force: the failed run planned batch n + 1 just now, which looks like a query still running; it is not
        code, r = cli_json("rollback", run.checkpoint, "--to-batch", str(n - 1), "--sink", run.output, "--yes",
                           "--force", *INTERVALS)
        assert code == 0, r
        progress = run.run_query(spark)
        assert progress[0]["batchId"] == n, progress[0]  # the cut batch again, from the state batch n - 1 left
    finally:
        run.reset()
