"""Legacy DStream (Spark Streaming) checkpoint directories, listed by time (reference §9).

``checkpoint-<ms>`` files are Java-serialized ``Checkpoint`` objects; ``.bk`` is the previous
version kept by the writer; ``temp`` is written first and renamed. The driver's block WAL lives
in ``receivedBlockMetadata/log-<start>-<end>``. We list and date them; we never deserialize.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .listing import Listing

CHECKPOINT_FILE = re.compile(r"^checkpoint-(\d+)([\w.]*)$")  # Spark's own regex
WAL_FILE = re.compile(r"^log-(\d+)-(\d+)$")


@dataclass
class DStreamCheckpoint:
    time_ms: int
    rel: str
    size: int
    backup_rel: str | None = None


@dataclass
class DStreamModel:
    checkpoints: list[DStreamCheckpoint] = field(default_factory=list)
    block_logs: list[tuple[int, int, str, int]] = field(default_factory=list)  # start, end, rel, size
    received_data_logs: int = 0
    temp_file: str | None = None

    @property
    def latest(self) -> DStreamCheckpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None


def is_dstream_checkpoint(listing: Listing) -> bool:
    return any(CHECKPOINT_FILE.match(n) for n in listing.files_in(""))


def scan_dstream(listing: Listing) -> DStreamModel:
    model = DStreamModel()
    by_time: dict[int, DStreamCheckpoint] = {}
    backups: dict[int, str] = {}
    for name, info in listing.files_in("").items():
        m = CHECKPOINT_FILE.match(name)
        if m:
            t, suffix = int(m.group(1)), m.group(2)
            if suffix == ".bk":
                backups[t] = name
            elif suffix == "":
                by_time[t] = DStreamCheckpoint(t, name, info.size)
        elif name == "temp":
            model.temp_file = name
    for t, name in backups.items():
        if t in by_time:
            by_time[t].backup_rel = name
        else:
            info = listing.get(name)
            by_time[t] = DStreamCheckpoint(t, name, info.size if info else 0, backup_rel=name)
    model.checkpoints = [by_time[t] for t in sorted(by_time)]
    for name, info in listing.files_in("receivedBlockMetadata").items():
        m = WAL_FILE.match(name)
        if m:
            model.block_logs.append((int(m.group(1)), int(m.group(2)), f"receivedBlockMetadata/{name}", info.size))
    model.block_logs.sort()
    model.received_data_logs = sum(1 for _ in listing.under("receivedData"))
    return model
