"""Extend a checkpoint Spark wrote, in Spark's own formats, to thousands of batches in seconds.

For benchmarks only. Spark writing 10,000 micro-batches one at a time takes hours on the shared
development machine; this appends batches after the newest one Spark committed exactly as Spark's
stateless file-source -> file-sink query (``pipelines.event_counts.events_writer``) writes them:

* a real input file per batch (``write_event_files``), and its entry in the file-source log
  (``sources/0/<b>``, a ``.compact`` file holding every entry at each compaction batch);
* ``offsets/<b>`` (the newest Spark-written offsets file with the batch timestamp and the source's
  log offset moved on) and ``commits/<b>`` (a copy of the newest commit);
* a data file in the output (a byte copy of the newest data file Spark wrote, under a new part-file
  name) and its entry in the sink log ``_spark_metadata/<b>`` (compacted like the source log);
* on the local file system, the Hadoop ``.crc`` sidecar of every file, as Spark's writes leave them.

Both logs are left as Spark leaves them once their cleanup delay (``spark.sql.streaming.file{Source,Sink}
.log.cleanupDelay``, 10 minutes) has passed, as it has in any checkpoint that ran 10,000 batches: the
files before the previous compaction are deleted (``CompactibleFileStreamLog.deleteExpiredLog``).
``offsets/`` and ``commits/`` keep every batch (``minBatchesToRetain`` is the benchmark's size).

Spark is the judge: the benchmark's plain PySpark run then resumes from the extended checkpoint and
processes the next input files; a checkpoint Spark did not accept would fail that run. The data files
of the synthetic batches hold the rows of the copied batch, not those of their input file (nothing in
the benchmark reads them back).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

from checkpoint_ops.model.compactible import is_compaction_batch
from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_name
from pipelines.event_counts import write_event_files

SPARK_COMPACT_INTERVAL = 10  # spark.sql.streaming.file{Source,Sink}.log.compactInterval default


def _write(path: str, data: bytes, mtime_ms: int) -> None:
    with open(path, "wb") as f:
        f.write(data)
    d, name = os.path.split(path)
    crc = os.path.join(d, hadoop_crc_name(name))
    with open(crc, "wb") as f:
        f.write(hadoop_crc_bytes(data))
    for p in (path, crc):
        os.utime(p, ns=(mtime_ms * 10**6, mtime_ms * 10**6))


def _local(uri: str) -> str:
    path = uri[len("file:"):] if uri.startswith("file:") else uri
    while path.startswith("//"):
        path = path[1:]
    return path


def _uri_like(example: str, path: str) -> str:
    """``path`` as a URI written the way Spark wrote ``example`` (``file:/x`` or ``file:///x``)."""
    path = os.path.abspath(path)
    return example[: len(example) - len(_local(example))] + path if example.startswith("file:") else path


def _ids(d: str) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in os.listdir(d) if n.split(".")[0].isdigit() and not n.startswith("."))


def _entries(log_dir: str, upto: int, interval: int) -> list[str]:
    """Every entry of a compactible log as of ``upto`` (latest compact file and the plain files after)."""
    ids = [b for b in _ids(log_dir) if b <= upto]
    compacts = [b for b in ids if is_compaction_batch(b, interval)]
    start = compacts[-1] if compacts else 0
    out: list[str] = []
    for b in range(start, upto + 1):
        name = f"{b}.compact" if is_compaction_batch(b, interval) else str(b)
        with open(os.path.join(log_dir, name), encoding="utf-8") as f:
            out += [line for line in f.read().split("\n")[1:] if line]
    return out


def extend(checkpoint: str, output: str, input_dir: str, batches: int,
           interval: int = SPARK_COMPACT_INTERVAL) -> int:
    """Append batches after the newest committed one until the checkpoint holds ``batches`` batches
    (ids ``0..batches-1``). Returns the number of batches written. Input file ``i`` is batch ``i``'s.

    The synthetic batches run 1 ms apart from a second after the newest batch Spark ran: every file of
    batch b is written at its planning time (``batchTimestampMs``), as the pairing rule of a checkpoint
    and its output expects (``checkpoint_ops/pairing.py``), and all of them lie before the next real run."""
    last = _ids(os.path.join(checkpoint, "commits"))[-1]
    if last + 1 >= batches:
        return 0
    with open(os.path.join(checkpoint, "offsets", str(last)), encoding="utf-8") as f:
        head, meta_line, *source_lines = f.read().split("\n")
    meta = json.loads(meta_line)
    (source_line,) = source_lines
    log_offset = json.loads(source_line)["logOffset"]
    with open(os.path.join(checkpoint, "commits", str(last)), "rb") as f:
        commit = f.read()
    src_dir, sink_dir = os.path.join(checkpoint, "sources", "0"), os.path.join(output, "_spark_metadata")
    src_entries = _entries(src_dir, log_offset, interval)
    sink_entries = _entries(sink_dir, last, interval)
    template = json.loads(sink_entries[-1])
    src_template = json.loads(src_entries[-1])
    model_file = _local(template["path"])
    now_ms = meta["batchTimestampMs"]
    written = 0
    final_k = log_offset + (batches - 1 - last)
    keep_src = _latest_compact(final_k, interval) - interval  # what cleanup keeps: from here on
    keep_sink = _latest_compact(batches - 1, interval) - interval
    for b in range(last + 1, batches):
        k = log_offset + (b - last)
        (path,) = write_event_files(input_dir, b, b + 1)
        src = {**src_template, "path": _uri_like(src_template["path"], path),
               "timestamp": int(os.stat(path).st_mtime * 1000), "batchId": k}
        src_entries.append(json.dumps(src, separators=(",", ":")))
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        data = os.path.join(output, name)
        shutil.copyfile(model_file, data)
        shutil.copyfile(os.path.join(os.path.dirname(model_file), hadoop_crc_name(os.path.basename(model_file))),
                        os.path.join(output, hadoop_crc_name(name)))
        now_ms += 1000 if b == last + 1 else 1
        for p in (data, os.path.join(output, hadoop_crc_name(name))):
            os.utime(p, ns=(now_ms * 10**6, now_ms * 10**6))
        sink_entries.append(json.dumps({**template, "path": _uri_like(template["path"], data),
                                        "size": os.stat(data).st_size, "modificationTime": now_ms},
                                       separators=(",", ":")))
        _write(os.path.join(checkpoint, "offsets", str(b)),
               "\n".join([head, json.dumps({**meta, "batchTimestampMs": now_ms}, separators=(",", ":")),
                          json.dumps({"logOffset": k}, separators=(",", ":"))]).encode(), now_ms)
        for log_dir, entries, n, keep in ((src_dir, src_entries, k, keep_src), (sink_dir, sink_entries, b, keep_sink)):
            if n < keep:
                continue  # deleted by the logs' cleanup before anyone reads the checkpoint
            if is_compaction_batch(n, interval):
                _write(os.path.join(log_dir, f"{n}.compact"), "\n".join(["v1", *entries]).encode(), now_ms)
            else:
                _write(os.path.join(log_dir, str(n)), f"v1\n{entries[-1]}".encode(), now_ms)
        _write(os.path.join(checkpoint, "commits", str(b)), commit, now_ms)
        written += 1
    for log_dir, keep in ((src_dir, keep_src), (sink_dir, keep_sink)):  # and Spark's own files below
        for name in os.listdir(log_dir):
            head_id = name.lstrip(".").split(".")[0]
            if head_id.isdigit() and int(head_id) < keep:
                os.remove(os.path.join(log_dir, name))
    return written


def _latest_compact(batch_id: int, interval: int) -> int:
    return (batch_id + 1) // interval * interval - 1
