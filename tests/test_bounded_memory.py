"""Big log files are checked streamed, never held: the findings are exactly those of reading them whole
(a stale .crc sidecar of the same size, a line in the middle that is not JSON)."""

from __future__ import annotations

import os

from benchmarks import synthetic
from checkpoint_ops import fsck as fsck_module
from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.storage.checksums import hadoop_crc_bytes


def test_streamed_check_finds_what_reading_whole_finds(tmp_path, monkeypatch):
    root = str(tmp_path / "ck")
    synthetic.write_local(root, batches=3000, partitions=2, retain_state=5, retain_log=30, retain_offsets=30)
    os.remove(os.path.join(root, "state/0/0/_metadata/schema"))  # a placeholder, not a schema file
    src = os.path.join(root, "sources", "0")
    compacts = sorted(n for n in os.listdir(src) if n.endswith(".compact"))
    data = open(os.path.join(src, compacts[0]), "rb").read()
    open(os.path.join(src, f".{compacts[0]}.crc"), "wb").write(hadoop_crc_bytes(data[:-1] + b"X"))
    lines = open(os.path.join(src, compacts[1]), "rb").read().split(b"\n")
    lines[50] = b"not json"
    open(os.path.join(src, compacts[1]), "wb").write(b"\n".join(lines))
    open(os.path.join(src, f".{compacts[1]}.crc"), "wb").write(hadoop_crc_bytes(b"\n".join(lines)))

    whole = [f.to_dict() for f in fsck_module.run_fsck(Checkpoint.open(root))]
    monkeypatch.setattr(fsck_module.Fsck, "STREAM_ABOVE", 100)  # every source log file streamed
    streamed = [f.to_dict() for f in fsck_module.run_fsck(Checkpoint.open(root))]
    assert {f["code"] for f in whole} >= {"stale-crc", "not-json"}
    assert streamed == whole
