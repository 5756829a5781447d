"""``sink retain`` that would keep only batches that kept no row, with Spark: for such a micro-batch Spark
writes one Parquet file without a row (and its log entry), so the log still lists a file, yet every file with
rows goes with the batches dropped and readers read nothing (exit 0 before). Refused unless ``--force``; the
refusal names the newest batch that wrote rows. Spark reads the result of each step."""

from __future__ import annotations

import json
import os

from tests.helpers import cli_json, content_snapshot
from tests.spark_runs import SESSION_CONF

FILES = 6  # batch b reads file b; the last two keep no row (every value negative, filtered out); 4 is a compact file


def test_retain_keeping_only_rowless_batches_is_refused(spark, tmp_path):
    for k, v in SESSION_CONF.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    incoming, ckpt, out = str(tmp_path / "in"), str(tmp_path / "ck"), str(tmp_path / "out")
    os.makedirs(incoming)
    for b in range(FILES):
        sign = -1 if b >= FILES - 2 else 1
        path = os.path.join(incoming, f"f{b:02d}.json")
        with open(path, "w") as f:
            f.write("".join(json.dumps({"v": sign * (10 * b + j + 1)}) + "\n" for j in range(3)))
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # read oldest first, one a batch
    df = spark.readStream.schema("v LONG").option("maxFilesPerTrigger", 1).json(incoming)
    df.where("v > 0").writeStream.format("parquet").option("checkpointLocation", ckpt).trigger(
        availableNow=True).start(out).awaitTermination()
    assert spark.read.parquet(out).count() == 3 * (FILES - 2)
    assert '"path"' in open(os.path.join(out, "_spark_metadata", str(FILES - 1))).read()  # a file, without rows

    before = content_snapshot(ckpt, out)
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", FILES - 3,
                       "--delete-files", "--yes")
    assert code == 1 and r["error"] == "RefusedError", r  # exit 0 before: readers then read 0 rows
    assert "list only files without a row" in r["problem"], r
    assert f"--keep-after-batch {FILES - 4} or lower keeps batch {FILES - 3}" in r["fix"], r
    assert content_snapshot(ckpt, out) == before
    assert spark.read.parquet(out).count() == 3 * (FILES - 2)

    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", FILES - 4, "--yes")
    assert code == 0, r  # batch FILES - 3's rows stay
    assert sorted(row.v for row in spark.read.parquet(out).collect()) == [10 * (FILES - 3) + j + 1 for j in range(3)]
    code, r = cli_json("sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", FILES - 3, "--force",
                       "--yes")
    assert code == 0 and any("--force overrode a refusal" in w for w in r["plan"]["warnings"]), r
    assert spark.read.parquet(out).count() == 0  # emptied on purpose, and said so
