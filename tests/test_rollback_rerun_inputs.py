"""A rollback over input files that are gone since (Spark's ``cleanSource=archive`` moved them): the plan warns
with the count, the files and what to do; with them moved back, Spark's rerun writes exactly the first run's
rows. Before, the plan said nothing, and the rerun silently lost the rows of every archived file."""

import json
import os
import shutil

from tests.helpers import cli_json

CLEANER_THREADS = "spark.sql.streaming.fileSource.cleaner.numThreads"  # 0: archived as the next batch is planned


def write_inputs(inp: str, count: int) -> list[str]:
    os.makedirs(inp, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(inp, f"part-{i}.json")
        with open(path, "w") as f:
            f.write("".join(json.dumps({"file": i, "row": r}) + "\n" for r in range(3)))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # Spark takes the oldest first: batch i reads file i
        paths.append(path)
    return paths


def run_query(spark, inp: str, archive: str, out: str, ckpt: str) -> None:
    frame = (spark.readStream.format("json").schema("file INT, row INT").option("maxFilesPerTrigger", 1)
             .option("cleanSource", "archive").option("sourceArchiveDir", archive).load(inp))
    query = (frame.writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
    query.awaitTermination()


def read_by(ckpt: str, batch: int) -> list[str]:
    """The input files batch ``batch`` read, from its file-source log file (local paths)."""
    with open(os.path.join(ckpt, "sources", "0", str(batch))) as f:
        return [json.loads(line)["path"].removeprefix("file://") for line in f.read().splitlines()[1:]]


def rows(spark, out: str) -> list[tuple]:
    return sorted((r.file, r.row) for r in spark.read.parquet(out).collect())


def test_a_rollback_over_archived_input_warns_and_the_files_moved_back_rerun_exactly(spark, tmp_path):
    base = str(tmp_path)
    inp, archive, out, ckpt = (os.path.join(base, d) for d in ("input", "archive", "output", "checkpoint"))
    paths = write_inputs(inp, 4)
    before = spark.conf.get(CLEANER_THREADS, None)
    spark.conf.set(CLEANER_THREADS, "0")
    try:
        run_query(spark, inp, archive, out, ckpt)  # batches 0..3, one file each
        expected = rows(spark, out)
        assert expected == [(i, r) for i in range(4) for r in range(3)]
        read_after_1 = [read_by(ckpt, b) for b in (2, 3)]
        assert read_after_1 == [[paths[2]], [paths[3]]]
        later = [p for p in paths[2:] if not os.path.exists(p)]
        assert paths[2] in later  # archived when batch 3 was planned

        rollback = ["rollback", ckpt, "--to-batch", "1", "--sink", out]
        code, doc = cli_json(*rollback, "--dry-run")
        assert code == 0, doc
        [warning] = [w for w in doc["plan"]["warnings"] if "no longer where Spark read them" in w]
        assert warning.startswith(f"sources/0: {len(later)} of the 2 input files batches 2..3 read"), warning
        assert all(f"file://{p}" in warning for p in later), warning
        assert "sourceArchiveDir" in warning and "not looked for" not in warning, warning

        for p in later:  # the fix the warning gives: each back from the archive, which keeps its full path
            shutil.move(os.path.join(archive, p.lstrip("/")), p)
        code, doc = cli_json(*rollback, "--dry-run")
        assert code == 0 and not [w for w in doc["plan"]["warnings"] if "no longer where" in w], doc["plan"]
        code, doc = cli_json(*rollback, "--yes")
        assert code == 0, doc

        run_query(spark, inp, archive, out, ckpt)
        assert rows(spark, out) == expected
    finally:
        if before is None:
            spark.conf.unset(CLEANER_THREADS)
        else:
            spark.conf.set(CLEANER_THREADS, before)
