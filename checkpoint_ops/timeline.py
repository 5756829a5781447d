"""When each batch ran, from the checkpoint's offsets log (``batchTimestampMs``), with the batch ledger for
batches whose offsets file Spark has already deleted: what on call reads to choose a rollback target by time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from .ledger import Ledger
from .model.checkpoint import Checkpoint


def iso_ms(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC (``2026-11-21T06:30:00.123Z``); None stays None."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class BatchTime:
    """A batch and the time Spark planned it (its offsets file's ``batchTimestampMs``)."""

    batch: int
    timestamp_ms: int | None
    source: str  # "offsets/N", "ledger" or "unknown" (neither has the batch any more)

    @property
    def time(self) -> str | None:
        return iso_ms(self.timestamp_ms)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "time": self.time, "timestamp_ms": self.timestamp_ms, "source": self.source}


def batch_times(ckpt: Checkpoint, batches: Iterable[int], ledger: Ledger | None = None) -> dict[int, BatchTime]:
    """The planning time of each of ``batches``: from ``offsets/N`` when Spark still keeps it, else from the
    ledger's copy of it; ``timestamp_ms`` None (source "unknown") when neither has it. Reads only; a damaged
    offsets file counts as absent here (fsck names it)."""
    wanted = sorted(set(batches))
    on_disk = [b for b in wanted if b in ckpt.offset_files]
    loaded = ckpt.load_offsets(on_disk, errors=[]) if on_disk else {}
    out: dict[int, BatchTime] = {}
    for b in wanted:
        seq = loaded.get(b)
        if seq is not None:
            out[b] = BatchTime(b, seq.timestamp_ms, f"offsets/{b}")
        elif ledger is not None and ledger.has("offsets", b):
            out[b] = BatchTime(b, ledger.offsets(b).timestamp_ms, "ledger")
        else:
            out[b] = BatchTime(b, None, "unknown")
    return out
