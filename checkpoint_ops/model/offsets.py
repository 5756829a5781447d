"""``offsets/N``: the write-ahead log of the source offsets each batch ends at (``OffsetSeqLog``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .logfile import TORN_LOG_FIX, LogFormatError, parse_json_line, split_versioned

VOID_OFFSET = "-"
PROVIDER_CLASS_KEY = "spark.sql.streaming.stateStore.providerClass"
CODEC_KEY = "spark.sql.streaming.stateStore.compression.codec"


@dataclass(frozen=True)
class SourceOffset:
    """One source's offset in a batch: ``source_id`` is the position ("0") or the source name."""

    source_id: str
    raw: str | None  # the JSON text, None for "-" (no offset yet)

    @property
    def value(self) -> object:
        return None if self.raw is None else json.loads(self.raw)

    @property
    def kind(self) -> str:
        return offset_kind(self.value)

    @property
    def log_offset(self) -> int | None:
        v = self.value
        if isinstance(v, dict) and isinstance(v.get("logOffset"), int):
            return v["logOffset"]
        return None


@dataclass(frozen=True)
class OffsetSeq:
    batch_id: int
    version: int
    metadata: dict = field(default_factory=dict)
    offsets: tuple[SourceOffset, ...] = ()

    @property
    def timestamp_ms(self) -> int | None:
        return self.metadata.get("batchTimestampMs")

    @property
    def watermark_ms(self) -> int | None:
        return self.metadata.get("batchWatermarkMs")

    @property
    def conf(self) -> dict:
        return self.metadata.get("conf") or {}

    def source(self, source_id: str) -> SourceOffset | None:
        for o in self.offsets:
            if o.source_id == source_id:
                return o
        return None


def offset_kind(value: object) -> str:
    """Best guess at the source type from an offset's JSON shape."""
    if value is None:
        return "none"
    if isinstance(value, dict):
        if set(value) == {"logOffset"}:
            return "file"
        if value and all(isinstance(v, dict) and all(str(k).lstrip("-").isdecimal() for k in v) for v in value.values()):
            return "kafka"
    if isinstance(value, int):
        return "long"  # LongOffset: memory, socket and older rate sources
    return "other"


def parse_offsets(data: bytes, path: str, batch_id: int) -> OffsetSeq:
    version, lines = split_versioned(data, path, "offsets")
    # "v1" or "v1\n": no metadata line. Spark's OffsetSeqLog.deserialize takes the next line unchecked and fails the
    # restart ("next on empty iterator"; tests/test_torn_offsets_spark.py has Spark read such a file)
    if not lines or lines == [""]:
        raise LogFormatError(
            "offsets file has a version line but no metadata line (truncated write?)",
            path=path,
            kind="truncated",
            fix=TORN_LOG_FIX,
        )
    meta_line, offset_lines = lines[0].strip(), lines[1:]
    metadata = {}
    if meta_line:
        md = parse_json_line(meta_line, path, 2, last=not offset_lines)
        if not isinstance(md, dict):
            raise LogFormatError("metadata line is not a JSON object", path=path, kind="malformed")
        metadata = md
    offsets = []
    for i, line in enumerate(offset_lines):
        lineno, last = i + 3, i == len(offset_lines) - 1
        if version >= 2:
            sid, sep, rest = line.partition(":")
            if not sep:
                raise LogFormatError(f"line {lineno} has no 'sourceId:' prefix (offsets v2)", path=path, kind="malformed")
        else:
            sid, rest = str(i), line
        if rest == VOID_OFFSET:
            offsets.append(SourceOffset(sid, None))
        else:
            parse_json_line(rest, path, lineno, last=last)
            offsets.append(SourceOffset(sid, rest))
    return OffsetSeq(batch_id, version, metadata, tuple(offsets))
