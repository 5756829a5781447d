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

import json
import os

from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_name

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
CONF = {"spark.sql.streaming.stateStore.providerClass": HDFS, "spark.sql.shuffle.partitions": None,
        "spark.sql.streaming.stateStore.compression.codec": "lz4"}


def files(batches: int, partitions: int, retain_state: int, snapshot_every: int = 10,
          source_interval: int = 10, retain_log: int = 100, input_dir: str = "/data/in"):
    """Yield (relative path, bytes) for the whole checkpoint."""
    conf = dict(CONF, **{"spark.sql.shuffle.partitions": str(partitions)})
    yield "metadata", b'{"id":"6f0c1c9e-7c1b-4a5e-9d38-1c0d2b3e4f50"}'
    t0 = 1_790_000_000_000
    for b in range(batches):
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

    yield "state/0/_metadata/metadata", (
        'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},"stateStoreInfo":'
        f'[{{"storeName":"default","numColsPrefixKey":0,"numPartitions":{partitions}}}]}}').encode()
    top = batches  # batch B-1 committed version B
    low = top - retain_state
    payload = lz4_block_stream(bytes(range(64)))
    for p in range(partitions):
        if p == 0:
            yield "state/0/0/_metadata/schema", b"\x00\x02v2" + b"\x00" * 16
        for v in range(low, top + 1):
            yield f"state/0/{p}/{v}.delta", payload
            if v % snapshot_every == 0:
                yield f"state/0/{p}/{v}.snapshot", lz4_block_stream(bytes(range(64)) * 4)


def lz4_block_stream(data: bytes) -> bytes:
    """``data`` framed as lz4-java's LZ4BlockOutputStream writes it: one raw (uncompressed) block,
    then the empty end-of-stream block (reference §5.1). Spark state files use this framing."""
    import struct
    import zlib

    token = 0x10 | 6  # raw method, compression level of a 64 KiB block size
    head = b"LZ4Block" + bytes([token])
    block = head + struct.pack("<iii", len(data), len(data), zlib.crc32(data) & 0xFFFFFFF) + data
    return block + head + struct.pack("<iii", 0, 0, 0)


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
