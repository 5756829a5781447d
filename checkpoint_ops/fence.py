"""The fence: what ``metadata`` holds while an operation changes a checkpoint.

Readable text that Spark cannot parse as ``metadata``, so no query starts from a checkpoint that
is half changed. It names the operation and its journal, says how to finish or revert it, and
carries the original ``metadata`` (the query id) so it is never lost.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from .journal import OPS_DIR
from .storage.paths import basename, dirname, join, parse_url, place_key

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
    what = "an undo" if f.operation == "undo" else f"a {f.operation}"
    text = (
        f"{FENCE_MAGIC.decode()} v1\n"
        f"operation: {f.operation} {f.op_id}\n"
        f"journal: {f.journal}\n"
        f"original-metadata: {f.original_metadata.decode('utf-8', 'replace')}\n"
        f"{what.capitalize()} by checkpoint-ops on this checkpoint is in progress or was interrupted.\n"
        "Spark must not start from it until it is finished or reverted:\n"
        f"  finish it: {resume_command(f.operation, checkpoint_url)}\n"
        f"  revert it: {revert_command(f.operation, checkpoint_url)}\n"
    )
    return text.encode()


# An interrupted operation is finished by `resume` and reverted by `undo`; an interrupted undo the other
# way round: `undo` finishes it, `resume` rolls the operation forward again.
def resume_command(operation: str, checkpoint_url: str) -> str:
    """The command that finishes an interrupted ``operation`` (``undo`` for an interrupted undo)."""
    return f"checkpoint-ops {'undo' if operation == 'undo' else 'resume'} {shlex.quote(checkpoint_url)}"


def revert_command(operation: str, checkpoint_url: str) -> str:
    """The command that reverts it instead."""
    return f"checkpoint-ops {'resume' if operation == 'undo' else 'undo'} {shlex.quote(checkpoint_url)}"


def fence_location(f: Fence) -> str | None:
    """The checkpoint location a fence's operation ran at, as that operation was given it: its journal lives beside
    it (``<parent>/.checkpoint-ops/<name>/journal/<op id>``, ``journal.ops_dir``). None if the fence names none."""
    if not f.journal or not f.op_id:
        return None
    try:
        journal = parse_url(f.journal)
    except ValueError:
        return None
    suffix = f"/journal/{f.op_id}"
    if not journal.path.endswith(suffix):
        return None
    ops = journal.path[: -len(suffix)]  # <parent>/.checkpoint-ops/<name>
    if basename(dirname(ops)) != OPS_DIR:
        return None
    return journal.url(join(dirname(dirname(ops)), basename(ops)))


def _journals_at(url: str) -> str:
    """The place of the ``.checkpoint-ops`` directory of the checkpoint ``url`` names, as ``journal.ops_dir`` finds it
    for that spelling: a checkpoint directory that is itself a symbolic link keeps its journals beside the link."""
    parent, _, name = url.rstrip("/").rpartition("/")
    return place_key(f"{parent}/{OPS_DIR}/{name}")


def journal_elsewhere(f: Fence, checkpoint_url: str) -> bool:
    """Whether the fence's journal is not where ``checkpoint_url`` keeps its journals: a copy made while fenced, or a
    checkpoint named through another link than the one the operation ran under (``recovery_advice`` says which)."""
    ran_at = fence_location(f)
    return ran_at is not None and (place_key(ran_at) != place_key(checkpoint_url)
                                   or _journals_at(ran_at) != _journals_at(checkpoint_url))


def recovery_advice(f: Fence, checkpoint_url: str) -> str:
    """The ``fix:`` for anything refused because the checkpoint is fenced."""
    ran_at = fence_location(f)
    elsewhere = ran_at is not None and place_key(ran_at) != place_key(checkpoint_url)
    if elsewhere and parse_url(ran_at).is_local and not os.path.lexists(parse_url(ran_at).path):
        # gone: a link it ran under, removed since (or the original of a copy, deleted)
        return (f"the {f.operation} ran under the name {ran_at}, which is gone, and its journal is beside that name: "
                f"if it was a symbolic link to this checkpoint, make it again (`ln -s {checkpoint_url} {ran_at}`) and "
                f"run `{resume_command(f.operation, ran_at)}` (or `{revert_command(f.operation, ran_at)}`); if this "
                f"checkpoint was moved from there, move it and its {OPS_DIR} directory back first")
    if elsewhere:
        # `resume` and `undo` here refuse a journal of another location (executor.foreign_journal)
        return (f"this checkpoint was copied (or moved) from {ran_at} while a {f.operation} there had it fenced: "
                f"finish that {f.operation} there (`{resume_command(f.operation, ran_at)}`, or "
                f"`{revert_command(f.operation, ran_at)}`; moved: move the checkpoint and its {OPS_DIR} directory "
                "back first), then copy the checkpoint again")
    if ran_at is not None and _journals_at(ran_at) != _journals_at(checkpoint_url):
        checkpoint_url = ran_at  # named here through another link: the journal is found by the name it ran under
    if f.operation == "undo":
        return (f"finish the undo with `{resume_command(f.operation, checkpoint_url)}`, or go back to the result of "
                f"the operation it was undoing with `{revert_command(f.operation, checkpoint_url)}`")
    return (f"finish the {f.operation} with `{resume_command(f.operation, checkpoint_url)}`, or revert it with "
            f"`{revert_command(f.operation, checkpoint_url)}`")


def parse_fence(data: bytes) -> Fence:
    fields = {}
    for line in data.decode("utf-8", "replace").split("\n")[1:5]:
        k, _, v = line.partition(": ")
        fields[k] = v
    op, _, op_id = fields.get("operation", "").partition(" ")
    return Fence(op, op_id, fields.get("journal", ""), fields.get("original-metadata", "").encode())


