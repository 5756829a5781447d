"""What Spark does with a ``commits/N`` cut to its version line, which fsck calls a torn write.

``parse_commit`` (checkpoint_ops/model/commits.py) refuses such a file as ``truncated-log-file``: Spark writes the
metadata line in every commit, and reads a missing one as ``{}``. The refusal says what that costs; this proves it
with Spark: from the cut file Spark resumes, without a word, with the watermark the batch ran with instead of the
later one it committed, so the next batch is judged against an older watermark than it would have been.
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
