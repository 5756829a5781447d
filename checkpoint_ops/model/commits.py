"""``commits/N``: batch N finished (``CommitLog``, versions 1-3)."""

from __future__ import annotations

from dataclasses import dataclass

from .logfile import TORN_LOG_FIX, LogFormatError, parse_json_line, split_versioned


@dataclass(frozen=True)
class CommitMetadata:
    batch_id: int
    version: int
    next_batch_watermark_ms: int | None = None
    # operator id -> partition -> one unique id per store (checkpoint format V2); these are the
    # ids of state version N+1, the files batch N produced.
    state_unique_ids: dict[str, list[list[str]]] | None = None
    sink_metadata: dict | None = None

    def unique_id(self, op_id: int, partition: int, store_index: int = 0) -> str | None:
        ids = (self.state_unique_ids or {}).get(str(op_id))
        if ids is None or partition >= len(ids) or store_index >= len(ids[partition]):
            return None
        return ids[partition][store_index]


def parse_commit(data: bytes, path: str, batch_id: int) -> CommitMetadata:
    version, lines = split_versioned(data, path, "commits")
    body = "\n".join(lines).strip()
    if not body:
        # Spark reads a missing JSON line as {}, but writes one in every commit (``{}`` in 2.1, the watermark
        # since): a commit without it was cut short. At restart Spark takes the larger of the watermark the
        # batch ran with (its offsets file) and the commit's nextBatchWatermarkMs (MicroBatchExecution
        # .populateStartOffsets): read as {}, that is the batch's own, not the one it committed
        raise LogFormatError("the commit has its version line only, not the metadata line Spark writes after it "
                             "(a torn write): Spark reads it as {}, so a restart from it takes the watermark this batch "
                             "ran with, not the one it committed; in checkpoint format V2 it names no state to load, and "
                             "the restart fails (CANNOT_LOAD_STATE_STORE)",
                             path=path, kind="truncated", fix="a crash left a torn write: " + TORN_LOG_FIX)
    doc = parse_json_line(body, path, 2, last=True)
    if not isinstance(doc, dict):
        raise LogFormatError("commit metadata is not a JSON object", path=path, kind="malformed")
    return CommitMetadata(
        batch_id,
        version,
        doc.get("nextBatchWatermarkMs"),
        doc.get("stateUniqueIds"),
        doc.get("sinkMetadataMap"),
    )
