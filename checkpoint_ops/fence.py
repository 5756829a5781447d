"""The fence: what ``metadata`` holds while an operation changes a checkpoint.

Readable text that Spark cannot parse as ``metadata``, so no query starts from a checkpoint that
is half changed. It names the operation and its journal, says how to finish or revert it, and
carries the original ``metadata`` (the query id) so it is never lost.
"""

from __future__ import annotations

from dataclasses import dataclass

FENCE_MAGIC = b"CHECKPOINT-OPS-FENCE"


@dataclass
class Fence:
    operation: str  # rollback | undo
    op_id: str
    journal: str
    original_metadata: bytes


def is_fence(data: bytes | None) -> bool:
    return bool(data) and data.startswith(FENCE_MAGIC)


def fence_bytes(f: Fence, checkpoint_url: str) -> bytes:
    text = (
        f"{FENCE_MAGIC.decode()} v1\n"
        f"operation: {f.operation} {f.op_id}\n"
        f"journal: {f.journal}\n"
        f"original-metadata: {f.original_metadata.decode('utf-8', 'replace')}\n"
        "A checkpoint-ops operation on this checkpoint is in progress or was interrupted.\n"
        "Spark must not start from it until the operation is finished or reverted:\n"
        f"  {resume_command(f.operation, checkpoint_url)}   (finish it)\n"
        f"  checkpoint-ops undo {checkpoint_url}   (revert it)\n"
    )
    return text.encode()


def resume_command(operation: str, checkpoint_url: str) -> str:
    """How to finish an interrupted operation (``undo`` finishes an interrupted undo)."""
    if operation == "undo":
        return f"checkpoint-ops undo {checkpoint_url}"
    if operation == "rollback":
        return f"checkpoint-ops rollback {checkpoint_url} --resume"
    return f"checkpoint-ops resume {checkpoint_url}"


def parse_fence(data: bytes) -> Fence:
    fields = {}
    for line in data.decode("utf-8", "replace").split("\n")[1:5]:
        k, _, v = line.partition(": ")
        fields[k] = v
    op, _, op_id = fields.get("operation", "").partition(" ")
    return Fence(op, op_id, fields.get("journal", ""), fields.get("original-metadata", "").encode())


