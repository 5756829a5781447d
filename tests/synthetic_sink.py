"""A file sink's output for a synthetic checkpoint (``benchmarks/synthetic.py``): one data file per batch,
its ``_spark_metadata`` log entry stamped while the checkpoint ran that batch (so the pairing check sees
the output as this checkpoint's)."""

from __future__ import annotations

import json
import os

FIRST_BATCH_MS = 1790000000000  # when the synthetic checkpoint's batch 0 ran (one batch a second)


def write_sink(out: str, batches: int, folders: dict[int, str] | None = None,
               compact_interval: int | None = None, empty: frozenset[int] = frozenset()) -> dict[int, str]:
    """``out/_spark_metadata/0..batches-1`` and a data file per batch, in ``out`` or, for a batch in
    ``folders``, under that folder of ``out`` (a partition directory). With ``compact_interval``, every
    batch Spark compacts at is a ``<batch>.compact`` file holding every entry up to it, as Spark writes it
    (every log file kept: delete those Spark's cleanup would). A batch in ``empty`` wrote no row: Spark writes
    its log file with the version line alone, and no data file. Returns batch -> data file path."""
    assert not (empty and compact_interval), "an empty batch inside a compact file is not written here"
    os.makedirs(f"{out}/_spark_metadata", exist_ok=True)
    written = {}
    lines: list[str] = []
    for batch in range(batches):
        if batch in empty:
            with open(f"{out}/_spark_metadata/{batch}", "w") as f:
                f.write("v1")
            continue
        folder = f"{out}/{folders[batch]}" if folders and batch in folders else out
        os.makedirs(folder, exist_ok=True)
        path = f"{folder}/part-{batch:05d}-c000.json"
        data = f'{{"batch":{batch}}}\n'.encode()
        with open(path, "wb") as f:
            f.write(data)
        entry = {"path": f"file://{path}", "size": len(data), "isDir": False,
                 "modificationTime": FIRST_BATCH_MS + batch * 1000 + 500, "blockReplication": 1,
                 "blockSize": 33554432, "action": "add"}
        lines.append(json.dumps(entry, separators=(",", ":")))
        if compact_interval and (batch + 1) % compact_interval == 0:
            with open(f"{out}/_spark_metadata/{batch}.compact", "w") as f:
                f.write("\n".join(["v1", *lines]))
        else:
            with open(f"{out}/_spark_metadata/{batch}", "w") as f:
                f.write("v1\n" + lines[-1])
        written[batch] = path
    return written
