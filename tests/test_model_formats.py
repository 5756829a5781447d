"""Parsers and Spark's arithmetic, on small inputs (bad input, and formats we cannot produce here)."""

from __future__ import annotations

import pytest

from checkpoint_ops.model.commits import parse_commit
from checkpoint_ops.model.compactible import (
    all_valid_batches,
    derive_compact_interval,
    infer_interval,
    is_compaction_batch,
    valid_batches_before_compaction,
)
from checkpoint_ops.model.logfile import LogFormatError, UnknownVersionError
from checkpoint_ops.model.offsets import parse_offsets
from checkpoint_ops.storage.checksums import crc32c, hadoop_crc_bytes, hadoop_crc_size, spark_checksum_json


def test_compaction_arithmetic_matches_spark_examples():
    # Examples from CompactibleFileStreamLog's own docs.
    assert [b for b in range(10) if is_compaction_batch(b, 3)] == [2, 5, 8]
    assert list(valid_batches_before_compaction(5, 3)) == [2, 3, 4]
    assert list(all_valid_batches(7, 3)) == [5, 6, 7]
    assert list(all_valid_batches(1, 3)) == [0, 1]
    # deriveCompactInterval: "if defaultCompactInterval is 5 ... 11.compact ... new interval = 6"
    assert derive_compact_interval(5, 11) == 6
    assert derive_compact_interval(10, 4) == 5
    assert derive_compact_interval(5, 9) == 10
    assert infer_interval([4, 9, 14], 10)[0] == 5


def test_offsets_v1_void_and_metadata():
    data = b'v1\n{"batchWatermarkMs":5,"batchTimestampMs":7,"conf":{"a":"b"}}\n{"logOffset":3}\n-'
    o = parse_offsets(data, "offsets/3", 3)
    assert (o.version, o.watermark_ms, o.timestamp_ms, o.conf) == (1, 5, 7, {"a": "b"})
    assert [s.source_id for s in o.offsets] == ["0", "1"]
    assert o.offsets[0].log_offset == 3 and o.offsets[1].raw is None
    assert o.offsets[0].kind == "file"


def test_offsets_kafka_shape():
    o = parse_offsets(b'v1\n{}\n{"topic":{"0":12,"1":7}}', "p", 0)
    assert o.offsets[0].kind == "kafka"


@pytest.mark.parametrize(
    "data,kind",
    [
        (b"", "empty"),
        (b"v99\n{}\n{}", "unknown-version"),
        (b"{}\n{}", "no-version"),
        (b'v1\n{"batchWatermarkMs":0}\n{"logOffs', "truncated"),
        (b"v1", "truncated"),
        (b'v1\n{}\nnot-json\n{"logOffset":1}', "not-json"),
    ],
)
def test_offsets_bad_input_is_named(data, kind):
    with pytest.raises(LogFormatError) as e:
        parse_offsets(data, "/ck/offsets/9", 9)
    assert e.value.kind == kind
    assert e.value.path == "/ck/offsets/9" and e.value.fix


def test_unknown_version_is_reported_not_misparsed():
    with pytest.raises(UnknownVersionError) as e:
        parse_commit(b'v4\n{"nextBatchWatermarkMs":0}', "/ck/commits/1", 1)
    assert "v4" in e.value.problem and "max v3" in e.value.problem


def test_commit_v2_unique_ids():
    c = parse_commit(b'v2\n{"nextBatchWatermarkMs":0,"stateUniqueIds":{"0":[["a"],["b"]]}}', "p", 4)
    assert c.unique_id(0, 1) == "b" and c.unique_id(0, 2) is None and c.unique_id(1, 0) is None
    assert parse_commit(b"v1\n{}", "p", 0).next_batch_watermark_ms is None  # Spark 2.1 wrote {}
    for bare in (b"v1", b"v1\n", b"v1\n\n"):  # Spark reads a missing JSON line as {}, but always writes one
        with pytest.raises(LogFormatError) as torn:
            parse_commit(bare, "p", 0)
        assert torn.value.kind == "truncated" and "version line only" in torn.value.problem


def test_kafka_initial_offsets_file(tmp_path):
    """sources/<id>/0 of a Kafka source: one 0x00 byte, then v1 and the offsets (SPARK-19517)."""
    from checkpoint_ops.inspect import inspect_checkpoint
    from checkpoint_ops.model import Checkpoint

    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"t":{"0":0,"1":5}}')
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_bytes(b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"t":{"0":3,"1":9}}')
    (tmp_path / "metadata").write_bytes(b'{"id":"q"}')
    ck = Checkpoint.open(str(tmp_path))
    assert ck.sources["0"].kind == "kafka"
    (src,) = inspect_checkpoint(ck)["sources"]
    assert src["kind"] == "kafka" and src["initial_offsets"] == {"t": {"0": 0, "1": 5}}
    assert src["offset"] == {"t": {"0": 3, "1": 9}}


def test_checksum_formats():
    data = bytes(range(256)) * 5
    crc = hadoop_crc_bytes(data)
    assert crc[:8] == b"crc\x00\x00\x00\x02\x00" and len(crc) == hadoop_crc_size(len(data)) == 8 + 4 * 3
    assert crc32c(b"123456789") == 0xE3069283  # the CRC32C check value
    assert b'"algorithm":"CRC32C"' in spark_checksum_json(b"x")


def test_lz4_decoder_overlapping_matches():
    from checkpoint_ops.model.codecs import lz4_block_decompress

    # literal "ab", then a match of length 6 at offset 2 (overlapping copy) -> "abababab", then "c"
    block = bytes([0x22]) + b"ab" + bytes([0x02, 0x00]) + bytes([0x10]) + b"c"
    assert lz4_block_decompress(block, 9) == b"ababababc"


def test_hadoop_paths_as_operator_metadata_spells_them():
    """transformWithState's operator metadata names schema files by Path.toString: not URL-encoded,
    ``file:/`` locally, ``s3a://`` on S3; a restore reads and rewrites them in the same form."""
    from checkpoint_ops.storage.paths import Location, hadoop_path, hadoop_path_to_location

    cases = {
        "file:/data/ck 1/state/0/_stateSchema/default/0_a": Location("file", "/data/ck 1/state/0/_stateSchema/default/0_a", "file"),
        "file:///data/ck/x": Location("file", "/data/ck/x", "file"),
        "s3a://bucket/ck/state/0/_stateSchema/default/7_b": Location("s3", "bucket/ck/state/0/_stateSchema/default/7_b", "s3a"),
    }
    for text, loc in cases.items():
        assert hadoop_path_to_location(text) == loc
        assert hadoop_path_to_location(hadoop_path(loc)) == loc
    assert hadoop_path(cases["file:///data/ck/x"]) == "file:/data/ck/x"
    assert hadoop_path(Location("s3", "bucket/ck", "s3")) == "s3a://bucket/ck"


def test_operator_metadata_bad_input():
    from checkpoint_ops.model.operator_metadata import parse_operator_metadata

    good = (b'v2\n{"operatorInfo":{"operatorId":0,"operatorName":"transformWithStateInPandasExec"},"stateStoreInfo":'
            b'[{"storeName":"default","numColsPrefixKey":0,"numPartitions":2,"stateSchemaFilePaths":["file:/c/s"]}],'
            b'"operatorPropertiesJson":"{\\"timeMode\\":\\"EventTime\\"}"}')
    md = parse_operator_metadata(good, "state/0/_metadata/v2/7", "/c/state/0/_metadata/v2/7", 7)
    assert (md.format_version, md.name, md.batch, md.properties) == (2, "transformWithStateInPandasExec", 7,
                                                                      {"timeMode": "EventTime"})
    assert md.stores[0].schema_paths == ("file:/c/s",) and md.stores[0].partitions == 2
    for data, kind in [(b"", "empty"), (good[:60], "truncated"), (b"v3" + good[2:], "unknown-version"),
                       (b'v1\n{"operatorInfo":{}}', "malformed"), (b"\x00garbage", "no-version")]:
        with pytest.raises(LogFormatError) as e:
            parse_operator_metadata(data, "m", "/c/m")
        assert e.value.kind == kind, (data, e.value.problem)


def test_uri_path_quotes_as_hadoop_path_to_uri_does():
    """What Spark 4.x wrote into a file source log for ``/tmp/uni/in dir/café/f é 1.json`` (run here), and
    the characters ``java.net.URI`` quotes in a path: ASCII ones a path cannot hold, ``%``, control and
    space characters; letters of any script stay as they are. Read back, each names the same path."""
    from checkpoint_ops.storage.paths import spark_url_to_location, uri_path

    assert "file://" + uri_path("/tmp/uni/in dir/café/f é 1.json") == "file:///tmp/uni/in%20dir/café/f%20é%201.json"
    odd = "/a b/100%/q?#[]{}|\\^`\"<>/ü\u00a0\u2028\u0085\t/日本/x:y@z=1,2;$&+!*'()~_-."
    assert uri_path(odd) == ("/a%20b/100%25/q%3F%23%5B%5D%7B%7D%7C%5C%5E%60%22%3C%3E/ü%C2%A0%E2%80%A8%C2%85%09/日本"
                             "/x:y@z=1,2;$&+!*'()~_-.")
    assert spark_url_to_location("file://" + uri_path(odd)).path == odd
