"""What a backup stores (fast tier, no Spark).

* A big object copied by reflink holds exactly the bytes its hash names, even if its source grew.
"""

from __future__ import annotations

import fcntl
import hashlib
import os

from checkpoint_ops.storage import open_file_manager, rename


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---- big objects copied in the kernel ------------------------------------------------------------------------


def test_a_reflinked_object_whose_source_grew_holds_exactly_the_bytes_its_hash_names(tmp_path, monkeypatch):
    """FICLONE shares every extent of the source as it is when cloned. This machine's ext4 has no
    reflinks: the ioctl (the kernel's, not ours) is emulated as btrfs and XFS do it, the source growing
    between the size ``copy_in`` took and the clone."""
    os.makedirs(tmp_path / "src")
    src, content = str(tmp_path / "src" / "big"), b"A" * 1000
    with open(src, "wb") as f:
        f.write(content)
    real_ioctl = fcntl.ioctl

    def reflinking_ioctl(fd, request, arg, *rest):
        if request != rename.FICLONE:
            return real_ioctl(fd, request, arg, *rest)
        with open(src, "ab") as f:
            f.write(b"B" * 24)
        os.ftruncate(fd, 0)
        os.copy_file_range(arg, fd, os.fstat(arg).st_size, 0, 0)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", reflinking_ioctl)
    source, _ = open_file_manager(str(tmp_path / "src"))
    target, _ = open_file_manager(str(tmp_path / "dst"))
    target.hadoop_crc = False
    sha = hashlib.sha256(content).hexdigest()
    assert target.copy_in(source, src, str(tmp_path / "dst" / sha), sha256=sha)
    assert read(str(tmp_path / "dst" / sha)) == content
