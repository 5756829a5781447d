"""A rollback over input files that are gone since (Spark's ``cleanSource=archive`` moved them): the plan warns
with the count, the files and what to do; with them moved back, Spark's rerun writes exactly the first run's
rows. Before, the plan said nothing, and the rerun silently lost the rows of every archived file."""

import json
import os
import shutil

from checkpoint_ops.session_settings import session_settings
from tests.helpers import cli_json

CLEANER_THREADS = "spark.sql.streaming.fileSource.cleaner.numThreads"  # 0: archived as the next batch is planned
COMPACT = "spark.sql.streaming.fileSource.log.compactInterval"  # 3: log offsets 2 and 5 are compaction files


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
    paths = write_inputs(inp, 6)
    with session_settings(spark, {CLEANER_THREADS: "0", COMPACT: "3"}):
        run_query(spark, inp, archive, out, ckpt)  # batches 0..5, one file each
        expected = rows(spark, out)
        assert expected == [(i, r) for i in range(6) for r in range(3)]
        log = sorted(f for f in os.listdir(os.path.join(ckpt, "sources", "0")) if not f.startswith("."))
        assert log == ["0", "1", "2.compact", "3", "4", "5.compact"], log
        assert [read_by(ckpt, b) for b in (3, 4)] == [[paths[3]], [paths[4]]]  # batch i read file i
        gone = [p for p in paths[2:] if not os.path.exists(p)]  # read after batch 1
        assert paths[2] in gone and paths[4] in gone  # archived as batches 3 and 5 were planned

        rollback = ["rollback", ckpt, "--to-batch", "1", "--sink", out, "--source-compact-interval", "3"]
        code, doc = cli_json(*rollback, "--dry-run")
        assert code == 0, doc
        [warning] = [w for w in doc["plan"]["warnings"] if "no longer where Spark read them" in w]
        assert warning.startswith(f"sources/0: {len(gone)} of the 4 input files of its log offsets 2..5"), warning
        assert "sourceArchiveDir" in warning and "not looked for" not in warning, warning
        # all of them, batch 2's from its compaction file, decoded: where to move each back to
        assert sorted(doc["plan"]["summary"]["input files gone (sources/0)"]) == gone

        for p in gone:  # the fix the warning gives: each back from the archive, which keeps its full path
            shutil.move(os.path.join(archive, p.lstrip("/")), p)
        code, doc = cli_json(*rollback, "--dry-run")
        assert code == 0 and not [w for w in doc["plan"]["warnings"] if "no longer where" in w], doc["plan"]
        code, doc = cli_json(*rollback, "--yes")
        assert code == 0, doc

        run_query(spark, inp, archive, out, ckpt)
        assert rows(spark, out) == expected
