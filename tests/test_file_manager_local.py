"""The atomic file manager on local disk: atomic publish, cancel, racing writers, .crc sidecars."""

from __future__ import annotations

import os

import pytest

from checkpoint_ops.storage import open_file_manager
from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_matches
from tests.helpers import race_create_atomic


def _visible(d):
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_close_publishes_whole_file_with_fresh_crc(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    with fm.create_atomic(f"{root}/offsets/0") as out:
        out.write(b"v1\n")
        # nothing visible under the final name while writing
        assert "0" not in _visible(tmp_path / "offsets")
        out.write(b'{"a":1}')
    assert (tmp_path / "offsets" / "0").read_bytes() == b'v1\n{"a":1}'
    crc = (tmp_path / "offsets" / ".0.crc").read_bytes()
    assert hadoop_crc_matches(b'v1\n{"a":1}', crc)
    assert not [n for n in _visible(tmp_path / "offsets") if n.endswith(".tmp")]


def test_exception_inside_with_leaves_nothing(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    with pytest.raises(RuntimeError):
        with fm.create_atomic(f"{root}/offsets/7") as out:
            out.write(b"v1\npartial")
            raise RuntimeError("writer died")
    assert _visible(tmp_path / "offsets") == []


def test_cancel_leaves_nothing_and_keeps_existing_file(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    fm.write_bytes(f"{root}/x", b"old")
    w = fm.create_atomic(f"{root}/x", overwrite=True)
    w.write(b"new content")
    w.cancel()
    assert (tmp_path / "x").read_bytes() == b"old"
    assert _visible(tmp_path) == [".x.crc", "x"]


def test_overwrite_false_never_replaces(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    fm.write_bytes(f"{root}/commits/3", b"first")
    with pytest.raises(FileExistsError):
        fm.write_bytes(f"{root}/commits/3", b"second")
    assert (tmp_path / "commits" / "3").read_bytes() == b"first"


def test_overwrite_true_regenerates_stale_crc(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    (tmp_path / "f").write_bytes(b"a" * 600)
    (tmp_path / ".f.crc").write_bytes(hadoop_crc_bytes(b"a" * 600))
    fm.write_bytes(f"{root}/f", b"b" * 10, overwrite=True)
    assert hadoop_crc_matches(b"b" * 10, (tmp_path / ".f.crc").read_bytes())


def test_delete_removes_sidecars(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    name = "5_01234567-89ab-cdef-0123-456789abcdef.zip"
    for n in (name, f".{name}.crc", f"{name}.crc", f".{name}.crc.crc"):
        (tmp_path / n).write_bytes(b"x")
    fm.delete(f"{root}/{name}")
    assert _visible(tmp_path) == []


@pytest.mark.parametrize("round_", range(20))
def test_racing_writers_exactly_one_winner(tmp_path, round_):
    fm, root = open_file_manager(str(tmp_path))
    results = race_create_atomic([fm] * 4, f"{root}/offsets/42")
    assert results.count("won") == 1, results
    winner = results.index("won")
    assert (tmp_path / "offsets" / "42").read_bytes() == f"writer {winner}".encode()
    assert not [x for x in _visible(tmp_path / "offsets") if x.endswith(".tmp")]


def test_walk_and_counts(tmp_path):
    fm, root = open_file_manager(str(tmp_path))
    for i in range(3):
        fm.write_bytes(f"{root}/a/{i}", b"x")
    fm.counter.reset()
    files = fm.walk(root)
    assert sorted(os.path.basename(f.path) for f in files) == [".0.crc", ".1.crc", ".2.crc", "0", "1", "2"]
    assert fm.counter.snapshot()["list"] == 2  # root and a/


def test_strategy_override(tmp_path, monkeypatch):
    from checkpoint_ops.errors import StorageError

    fm, _ = open_file_manager(str(tmp_path), strategy="local-rename")
    assert fm.strategy == "local-rename"
    with pytest.raises(StorageError):
        open_file_manager(str(tmp_path), strategy="nope")
    monkeypatch.setenv("CHECKPOINT_OPS_FILE_MANAGER", "rename")
    fm, _ = open_file_manager(str(tmp_path))
    assert fm.strategy == "rename"  # the generic fsspec rename strategy also works on local paths
    fm.write_bytes(f"{tmp_path}/g", b"1")
    with pytest.raises(FileExistsError):
        fm.write_bytes(f"{tmp_path}/g", b"2")
    assert (tmp_path / "g").read_bytes() == b"1"
