"""A synthetic checkpoint with Spark's real file names and formats, at a size Spark tests never reach.

Layout (HDFS state store, one file source):

* ``metadata``; ``offsets/0..B-1`` and ``commits/0..B-1`` (v1, as Spark 4.3 writes them);
* ``sources/0/``: a file-source log compacted every 10 log offsets, keeping what
  ``minBatchesToRetain`` (``retain``) keeps: the compact before the window and everything after;
* ``state/0/<p>/``: for each of ``partitions`` partitions, ``<v>.delta`` for the retained versions and
  ``<v>.snapshot`` every ``snapshot_every`` versions; operator metadata and the schema file.
* On local disk every file gets its Hadoop ``.crc`` sidecar, as Spark's local file system writes them.
"""

from __future__ import annotations

import hashlib
import json
import os

from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_name

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
CONF = {"spark.sql.streaming.stateStore.providerClass": HDFS, "spark.sql.shuffle.partitions": None,
        "spark.sql.streaming.stateStore.compression.codec": "lz4"}


def _payload(p: int, v: int, kind: str, size: int) -> bytes:
    """Distinct, deterministic content of ``size`` bytes for one state file (real state files differ:
    a benchmark of content-addressed storage must not get identical files for free)."""
    seed = hashlib.sha256(f"{kind}/{p}/{v}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def files(batches: int, partitions: int, retain_state: int, snapshot_every: int = 10,
          source_interval: int = 10, retain_log: int = 100, input_dir: str = "/data/in",
          delta_bytes: int = 64, snapshot_bytes: int = 256, retain_offsets: int | None = None, operators: int = 1):
    """Yield (relative path, bytes) for the whole checkpoint, as Spark leaves it after batch
    ``batches - 1``: ``retain_state`` state versions, the source log's compact before ``retain_log``
    batches and what follows, and ``offsets/``/``commits/`` for every batch, or for the last
    ``retain_offsets`` + 1 (minBatchesToRetain) when given."""
    conf = dict(CONF, **{"spark.sql.shuffle.partitions": str(partitions)})
    yield "metadata", b'{"id":"6f0c1c9e-7c1b-4a5e-9d38-1c0d2b3e4f50"}'
    t0 = 1_790_000_000_000
    for b in range(0 if retain_offsets is None else max(0, batches - retain_offsets - 1), batches):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": t0 + b * 1000, "conf": conf}
        yield f"offsets/{b}", f"v1\n{json.dumps(meta, separators=(',', ':'))}\n{{\"logOffset\":{b}}}".encode()
        yield f"commits/{b}", b'v1\n{"nextBatchWatermarkMs":0}'

    def entry(k: int) -> str:
        return json.dumps({"path": f"file://{input_dir}/part-{k:06d}.json", "timestamp": t0 + k, "batchId": k},
                          separators=(",", ":"))

    last = batches - 1
    first_kept = max(0, last + 1 - retain_log)
    first_kept = first_kept - first_kept % source_interval - 1  # the compact before the window
    for k in range(max(0, first_kept), batches):
        if (k + 1) % source_interval == 0:
            yield f"sources/0/{k}.compact", "\n".join(["v1", *(entry(i) for i in range(k + 1))]).encode()
        else:
            yield f"sources/0/{k}", f"v1\n{entry(k)}".encode()

    top = batches  # batch B-1 committed version B
    low = top - retain_state
    for op in range(operators):  # ``operators`` stateful operators (ids 0..), each with ``partitions``
        yield f"state/{op}/_metadata/metadata", (
            f'v1\n{{"operatorInfo":{{"operatorId":{op},"operatorName":"stateStoreSave"}},"stateStoreInfo":'
            f'[{{"storeName":"default","numColsPrefixKey":0,"numPartitions":{partitions}}}]}}').encode()
        for p in range(partitions):
            if p == 0:
                yield f"state/{op}/0/_metadata/schema", schema_v2()
            for v in range(max(1, low), top + 1):
                kind = "delta" if op == 0 else f"delta{op}"
                yield f"state/{op}/{p}/{v}.delta", lz4_block_stream(_payload(p, v, kind, delta_bytes))
                if v % snapshot_every == 0:
                    yield f"state/{op}/{p}/{v}.snapshot", lz4_block_stream(
                        _payload(p, v, "snapshot" if op == 0 else f"snapshot{op}", snapshot_bytes))


def schema_v2() -> bytes:
    """A state schema file v2 as Spark writes it for ``groupBy(key).count()``: ``writeUTF("v2")``, then
    the key and the value schema JSON, each chunked (an int count, then ``writeUTF`` of each chunk)."""
    import struct

    def utf(text: str) -> bytes:
        raw = text.encode()
        return struct.pack(">H", len(raw)) + raw

    def chunked(text: str) -> bytes:
        return struct.pack(">i", 1) + utf(text)

    key = {"type": "struct", "fields": [{"name": "key", "type": "string", "nullable": True, "metadata": {}}]}
    value = {"type": "struct", "fields": [{"name": "count", "type": "long", "nullable": False, "metadata": {}}]}
    return utf("v2") + chunked(json.dumps(key, separators=(",", ":"))) + chunked(json.dumps(value, separators=(",", ":")))


def lz4_block_stream(data: bytes) -> bytes:
    """``data`` framed as lz4-java's LZ4BlockOutputStream writes it: one raw (uncompressed) block,
    then the empty end-of-stream block (reference §5.1). Spark state files use this framing."""
    import struct
    import zlib

    token = 0x10 | 6  # raw method, compression level of a 64 KiB block size
    head = b"LZ4Block" + bytes([token])
    block = head + struct.pack("<iii", len(data), len(data), zlib.crc32(data) & 0xFFFFFFF) + data
    return block + head + struct.pack("<iii", 0, 0, 0)


def advance_local(root: str, before: dict, after: dict, hadoop_crc: bool = False) -> tuple[int, int]:
    """Move a checkpoint written with ``files(**before)`` to ``files(**after)`` (more batches, as Spark
    runs them: new files appear, its retention deletes old ones). Returns (written, deleted)."""
    old = {rel: None for rel, _ in files(**before)}
    written = deleted = 0
    for rel, data in files(**after):
        if rel in old:
            del old[rel]
            continue
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        written += 1
    for rel in old:
        os.remove(os.path.join(root, rel))
        deleted += 1
    return written, deleted


def write_local(root: str, hadoop_crc: bool = True, **kw) -> int:
    n = 0
    made = set()
    for rel, data in files(**kw):
        path = os.path.join(root, rel)
        d = os.path.dirname(path)
        if d not in made:
            os.makedirs(d, exist_ok=True)
            made.add(d)
        with open(path, "wb") as f:
            f.write(data)
        n += 1
        if hadoop_crc:
            with open(os.path.join(d, hadoop_crc_name(os.path.basename(path))), "wb") as f:
                f.write(hadoop_crc_bytes(data))
            n += 1
    return n
