"""A restore killed part-way and resumed (fast tier, no Spark): what the resume asks the backup's store before it
copies again. On local disk, where the file manager counts each ``stat`` and listing as an object store counts a
HEAD and a LIST request: the same calls."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

from benchmarks import synthetic
from tests.helpers import cli_json


def _tree(root: str) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) below ``root``, but the lease's records (taken over and released)."""
    out: dict[str, bytes | None] = {}
    for d, dirs, names in os.walk(root):
        out.update({os.path.join(d, n): None for n in dirs})
        out.update({os.path.join(d, n): open(os.path.join(d, n), "rb").read() for n in names
                    if "checkpoint-ops.lease" not in n})
    return out


def _killed_restore(dest: str, backup_id: str, target: str, at: int) -> None:
    killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "backup", "restore", dest, backup_id, target,
                             "--yes"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, CHECKPOINT_OPS_KILL_AT=str(at)))
    assert killed.returncode == -9, (killed.stdout, killed.stderr)


def test_a_resumed_restore_lists_the_object_directories_instead_of_a_head_per_object(tmp_path):
    """The resume checks that every object the restore still copies from is in the backup before it writes (a prune
    may have collected them meanwhile). It asked with a HEAD per object: a whole restore's worth of requests before
    the first byte. It now lists each object directory that holds several of them; a missing object is still
    found, and refused, before anything changes."""
    ckpt = str(tmp_path / "ckpt")
    synthetic.write_local(ckpt, batches=300, partitions=4, retain_state=300)
    dest = str(tmp_path / "backups")
    code, made = cli_json("backup", "create", ckpt, dest)
    assert code == 0, made
    keys = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(dest, "objects")) for n in names]
    per_dir = collections.Counter(key.rsplit("/", 1)[0] for key in keys)
    asked_alone = sum(n for n in per_dir.values() if n < 4)  # directories of fewer are asked object by object
    assert len(keys) > 1000 and asked_alone < len(keys) // 4, (len(keys), per_dir)

    target = str(tmp_path / "restored")
    _killed_restore(dest, made["backup_id"], target, 600)
    code, r = cli_json("resume", target, "--yes")
    assert code == 0, r
    asked = r["result"]["requests"]["source"]
    assert asked.get("stat", 0) <= asked_alone + 2, asked  # was one per object (a HEAD each on S3): over a thousand
    assert asked.get("list", 0) <= len(per_dir) + 2, asked
    code, checked = cli_json("fsck", target)
    assert code == 0, checked

    # an object gone from a directory the resume lists is still found: refused, nothing changed
    other = str(tmp_path / "restored-again")
    _killed_restore(dest, made["backup_id"], other, 600)
    gone = [key for key in keys if per_dir[key.rsplit("/", 1)[0]] >= 4][0]  # in a directory the resume lists
    os.remove(gone)
    before = _tree(other)
    code, r = cli_json("resume", other, "--yes")
    assert code == 2, r
    assert "content it still has to copy is gone" in r["problem"] and gone.rsplit("/", 1)[-1] in json.dumps(r), r
    assert _tree(other) == before
