"""``sources/<id>/``: per-source logs (file-source log, Kafka initial offsets, others)."""

from __future__ import annotations

from dataclasses import dataclass

from .compactible import CompactibleLog
from .listing import Listing
from .logfile import LogFormatError, log_files, split_versioned


@dataclass
class SourceDir:
    source_id: str
    rel_dir: str
    kind: str  # "file" | "kafka" | "other" | "empty"
    log: CompactibleLog | None = None  # for file sources


def classify_sources(listing: Listing, default_interval: int) -> dict[str, SourceDir]:
    """Every ``sources/<id>`` directory, classified without reading (Kafka is read lazily)."""
    out: dict[str, SourceDir] = {}
    for sid in listing.subdirs("sources"):
        rel = f"sources/{sid}"
        files = log_files(listing, rel, compactible=True)
        if not files:
            out[sid] = SourceDir(sid, rel, "empty")
        elif any(f.compact for f in files.values()) or len(files) > 1:
            out[sid] = SourceDir(sid, rel, "file", CompactibleLog(listing, rel, "source log", default_interval))
        else:
            # A single "0": the Kafka initial-offsets file (leading 0x00) or a one-batch file log.
            (only,) = files.values()
            data = listing.fm.read_bytes(listing.abs(only.rel))
            if data[:1] == b"\x00":
                out[sid] = SourceDir(sid, rel, "kafka")
            elif _looks_like_file_entries(data):
                out[sid] = SourceDir(sid, rel, "file", CompactibleLog(listing, rel, "source log", default_interval))
            else:
                out[sid] = SourceDir(sid, rel, "other")
    return out


def _looks_like_file_entries(data: bytes) -> bool:
    import json

    lines = data.decode("utf-8", "replace").split("\n")
    if not lines[0].startswith("v"):
        return False
    if len(lines) == 1:
        return True  # "v1" alone: a batch that selected no file
    try:
        doc = json.loads(lines[1])
    except ValueError:
        return True  # damaged, but shaped like a log: let fsck report it precisely
    return isinstance(doc, dict) and "path" in doc and "batchId" in doc


def read_kafka_initial_offsets(listing: Listing, src: SourceDir) -> dict:
    import json

    rel = f"{src.rel_dir}/0"
    path = listing.url(rel)
    _, lines = split_versioned(listing.fm.read_bytes(listing.abs(rel)), path, "kafka initial offsets", strip_nul=True)
    try:
        return json.loads("\n".join(lines))
    except ValueError:
        raise LogFormatError("initial offsets are not JSON", path=path, kind="not-json") from None
