"""The atomic file manager on local disk: atomic publish, cancel, racing writers, .crc sidecars."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from checkpoint_ops.storage import FileChangedError, open_file_manager
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


def test_replace_if_same_checks_the_version_just_before_it_replaces_on_local_disk(tmp_path):
    """A rename cannot be made conditional: local disk says so (``conditional_replace``: leases detect a late
    renewal too, lease.py). But it names a version (inode, mtime, size), and checks it just before the rename, so
    a write that comes late does not replace what another process wrote, or deleted, since it read the file."""
    fm, root = open_file_manager(str(tmp_path))
    path = os.path.join(root, "record")
    fm.write_bytes(path, b"v1")
    data, version = fm.read_versioned(path)
    assert not fm.conditional_replace and data == b"v1" and version is not None
    fm.write_bytes(path, b"someone else's", overwrite=True)
    with pytest.raises(FileChangedError):
        fm.replace_if_same(path, b"v2", version)
    assert fm.read_bytes(path) == b"someone else's"
    data, version = fm.read_versioned(path)
    fm.replace_if_same(path, b"v2", version)
    assert fm.read_bytes(path) == b"v2"
    os.remove(path)
    with pytest.raises(FileNotFoundError):  # deleted since (a release, a break): not written back
        fm.replace_if_same(path, b"v3", version)
    assert not os.path.exists(path)
    fm.replace_if_same(path, b"v4", None)  # no version: unconditional
    assert fm.read_bytes(path) == b"v4"


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


# ---- bulk writes and kernel copies (backup destinations) -------------------------------------------


def _lean(tmp_path):
    """A manager as a backup destination uses it: no Hadoop sidecars, syncing deferred to ``sync()``."""
    fm, root = open_file_manager(str(tmp_path))
    fm.hadoop_crc, fm.defer_sync = False, True
    return fm, root


def _litter(d) -> list[str]:
    return [os.path.join(p, n) for p, _, names in os.walk(d) for n in names if n.endswith(".tmp")]


def test_write_many_publishes_new_files_and_never_replaces(tmp_path):
    fm, root = _lean(tmp_path)
    fm.write_bytes(f"{root}/objects/ab/old", b"there before")
    fm.counter.reset()
    created = fm.write_many([(f"{root}/objects/ab/new", b"new"), (f"{root}/objects/ab/old", b"other"),
                             (f"{root}/objects/cd/x", b"")])
    assert created == [True, False, True]
    assert (tmp_path / "objects" / "ab" / "old").read_bytes() == b"there before"
    assert (tmp_path / "objects" / "ab" / "new").read_bytes() == b"new"
    assert (tmp_path / "objects" / "cd" / "x").read_bytes() == b""
    assert _litter(tmp_path) == []
    assert not [n for n in os.listdir(tmp_path / "objects" / "ab") if n.endswith(".crc")]
    assert fm.counter.snapshot()["write"] == 2  # every publish counted, as write_bytes counts it


def test_write_many_without_renameat2_links_and_never_replaces(tmp_path, monkeypatch):
    """Where the kernel or file system refuses ``RENAME_NOREPLACE``, publishing falls back to ``link()``
    (which refuses an existing name as well) and stays there."""
    from checkpoint_ops.storage import rename

    refused = []

    def renameat2(*a):
        refused.append(a)
        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(rename, "_RENAMEAT2", renameat2)
    fm, root = _lean(tmp_path)
    assert fm.write_many([(f"{root}/o/a", b"1"), (f"{root}/o/b", b"2")]) == [True, True]
    assert fm.write_many([(f"{root}/o/a", b"3")]) == [False]
    assert len(refused) == 1 and fm.counter.snapshot()["link"] == 2
    assert [(tmp_path / "o" / n).read_bytes() for n in ("a", "b")] == [b"1", b"2"]
    assert _litter(tmp_path) == []


def test_write_many_keeps_sidecars_where_the_file_system_keeps_them(tmp_path):
    fm, root = open_file_manager(str(tmp_path))  # a checkpoint's manager: Hadoop .crc sidecars
    assert fm.write_many([(f"{root}/offsets/5", b"v1\n{}"), (f"{root}/offsets/6", b"v1\n{}")]) == [True, True]
    assert hadoop_crc_matches(b"v1\n{}", (tmp_path / "offsets" / ".5.crc").read_bytes())
    assert fm.write_many([(f"{root}/offsets/5", b"v1\nother")]) == [False]
    assert (tmp_path / "offsets" / "5").read_bytes() == b"v1\n{}"


def _five_files_killed_at_the_third(tmp_path, method: str) -> None:
    """``fm.<method>`` of five files ``o/0`` .. ``o/4`` (1000 bytes of i each) in a child process that the
    crash switch kills at its third mutating call."""
    import signal
    import subprocess
    import sys

    code = ("import sys; from checkpoint_ops.storage import open_file_manager\n"
            "fm, root = open_file_manager(sys.argv[1]); fm.hadoop_crc = False; fm.defer_sync = True\n"
            f"fm.{method}([(f'{{root}}/o/{{i}}', bytes([i]) * 1000) for i in range(5)])\n")
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="3")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr


def test_write_many_killed_before_a_publish_shows_only_whole_files(tmp_path):
    """The crash switch counts each publish: killed at the third, the first two are whole, the third and
    later are absent (a hidden temp file at most, which `backup prune` clears)."""
    _five_files_killed_at_the_third(tmp_path, "write_many")
    assert [n for n in _visible(tmp_path / "o") if not n.startswith(".")] == ["0", "1"]
    assert [(tmp_path / "o" / n).read_bytes() for n in ("0", "1")] == [b"\x00" * 1000, b"\x01" * 1000]
    assert len(_litter(tmp_path)) == 1  # the third one's temp file, never published


def test_write_many_direct_creates_in_place_and_never_replaces(tmp_path):
    """A backup's objects: each new file created under its own name (no temp file, no rename, no link),
    an existing one left as it is (False), and a name that needs a sidecar published as ``write_many``
    publishes it."""
    fm, root = _lean(tmp_path)
    fm.write_bytes(f"{root}/objects/ab/old", b"there before")
    fm.counter.reset()
    created = fm.write_many_direct([(f"{root}/objects/ab/new", b"new"), (f"{root}/objects/ab/old", b"other"),
                                    (f"{root}/objects/cd/x", b""), (f"{root}/objects/ab/new", b"again")])
    assert created == [True, False, True, False]
    assert (tmp_path / "objects" / "ab" / "old").read_bytes() == b"there before"
    assert (tmp_path / "objects" / "ab" / "new").read_bytes() == b"new"
    assert (tmp_path / "objects" / "cd" / "x").read_bytes() == b""
    assert _litter(tmp_path) == [] and _visible(tmp_path / "objects" / "ab") == ["new", "old"]
    assert fm.counter.snapshot() == {"write": 2}  # no rename, no link, no delete: one create each
    assert fm.names_may_be_partial

    ckpt, croot = open_file_manager(str(tmp_path / "ckpt"))  # a checkpoint's manager: Hadoop .crc sidecars
    assert ckpt.write_many_direct([(f"{croot}/offsets/5", b"v1\n{}")]) == [True]
    assert hadoop_crc_matches(b"v1\n{}", (tmp_path / "ckpt" / "offsets" / ".5.crc").read_bytes())


@pytest.mark.parametrize("round_", range(3))
def test_write_many_direct_racing_writers_exactly_one_creates(tmp_path, round_):
    import threading

    fm, root = _lean(tmp_path)
    barrier, results = threading.Barrier(4), [None] * 4

    def writer(i):
        barrier.wait()
        results[i] = fm.write_many_direct([(f"{root}/o/same", f"writer {i}".encode() * 1000)])[0]

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1, results
    assert (tmp_path / "o" / "same").read_bytes() == f"writer {results.index(True)}".encode() * 1000


def test_write_many_direct_killed_leaves_the_file_it_was_creating_empty_under_its_name(tmp_path):
    """The crash switch counts each file once its name exists, before its bytes: killed at the third, the
    first two are whole, the third is there but empty (what a dying writer leaves: no manifest may trust
    it unchecked), the later ones are absent, and there is no temp file."""
    _five_files_killed_at_the_third(tmp_path, "write_many_direct")
    assert _visible(tmp_path / "o") == ["0", "1", "2"]
    assert [(tmp_path / "o" / n).read_bytes() for n in ("0", "1", "2")] == [b"\x00" * 1000, b"\x01" * 1000, b""]
    assert _litter(tmp_path) == []


@pytest.mark.parametrize("refused", [
    pytest.param({"reflink": errno.EOPNOTSUPP}, id="no-reflink"),
    pytest.param({"reflink": errno.EXDEV, "copy_file_range": errno.EXDEV}, id="copy_file_range-EXDEV"),
    pytest.param({"reflink": errno.ENOTTY, "copy_file_range": errno.ENOSYS, "sendfile": errno.ENOSYS},
                 id="nothing-in-kernel"),
    pytest.param({"reflink": errno.EINVAL, "copy_file_range": "partial"}, id="copy_file_range-fails-half-way"),
])
def test_kernel_copy_falls_back_cleanly(tmp_path, monkeypatch, refused):
    """Each way the file system refuses is undone and the next is tried: the copy is byte for byte."""
    from checkpoint_ops.storage import rename

    data = os.urandom(3 * 2**20 + 17)
    (tmp_path / "src").write_bytes(data)
    real_cfr = os.copy_file_range

    def ioctl(*a):
        raise OSError(refused["reflink"], "refused")

    def copy_file_range(src, dst, count, offset_src=None, offset_dst=None):
        if refused.get("copy_file_range") == "partial":
            if offset_src == 0:  # the first call copies a part, the next fails
                return real_cfr(src, dst, 1000, offset_src, offset_dst)
            raise OSError(errno.EXDEV, "refused")
        raise OSError(refused["copy_file_range"], "refused")

    def sendfile(*a):
        raise OSError(refused["sendfile"], "refused")

    monkeypatch.setattr(rename.fcntl, "ioctl", ioctl)
    if "copy_file_range" in refused:
        monkeypatch.setattr(rename.os, "copy_file_range", copy_file_range)
    if "sendfile" in refused:
        monkeypatch.setattr(rename.os, "sendfile", sendfile)
    expected = "sendfile" if "copy_file_range" in refused else "copy_file_range"
    expected = "read/write" if "sendfile" in refused else expected
    with open(tmp_path / "src", "rb") as s, open(tmp_path / "dst", "w+b") as d:
        assert rename.kernel_copy(s.fileno(), d.fileno(), len(data)) == expected
    assert (tmp_path / "dst").read_bytes() == data


def test_kernel_copy_raises_what_is_not_a_refusal(tmp_path, monkeypatch):
    from checkpoint_ops.storage import rename

    (tmp_path / "src").write_bytes(b"x" * 100)

    def copy_file_range(*a, **k):
        raise OSError(errno.EIO, "disk error")

    monkeypatch.setattr(rename.os, "copy_file_range", copy_file_range)
    with open(tmp_path / "src", "rb") as s, open(tmp_path / "dst", "w+b") as d:
        with pytest.raises(OSError) as e:
            rename.kernel_copy(s.fileno(), d.fileno(), 100)
    assert e.value.errno == errno.EIO


def test_copy_in_publishes_only_the_content_it_was_asked_for(tmp_path):
    import hashlib

    src, sroot = open_file_manager(str(tmp_path / "ckpt"))
    fm, root = _lean(tmp_path / "dest")
    data = os.urandom(2**20)
    src.write_bytes(f"{sroot}/state/0/0/1.delta", data)
    sha = hashlib.sha256(data).hexdigest()
    assert fm.copy_in(src, f"{sroot}/state/0/0/1.delta", f"{root}/objects/{sha}", sha256=sha) is True
    assert (tmp_path / "dest" / "objects" / sha).read_bytes() == data
    assert fm.copy_in(src, f"{sroot}/state/0/0/1.delta", f"{root}/objects/{sha}", sha256=sha) is False
    # the source changed since it was hashed: nothing is published, nothing is left behind
    with pytest.raises(OSError, match="changed while it was being copied"):
        fm.copy_in(src, f"{sroot}/state/0/0/1.delta", f"{root}/objects/{'0' * 64}", sha256="0" * 64)
    assert _visible(tmp_path / "dest" / "objects") == [sha]
    with pytest.raises(FileNotFoundError):
        fm.copy_in(src, f"{sroot}/state/0/0/2.delta", f"{root}/objects/x")
    assert _litter(tmp_path / "dest") == []


def test_sync_flushes_the_file_system_of_the_managers_root(tmp_path):
    """``sync()`` (``syncfs`` of the root's file system) works for a root that does not exist yet (a new
    backup destination) and counts as one call."""
    fm, root = _lean(tmp_path / "not" / "yet")
    fm.write_many([(f"{root}/o/a", b"1")])
    fm.sync()
    fm2, _ = _lean(tmp_path / "missing")
    fm2.sync()
    assert fm.counter.snapshot()["sync"] == 1 and fm2.counter.snapshot()["sync"] == 1


def _moves(tmp_path, dirs: int, files: int) -> list[tuple[str, str]]:
    """``dirs`` source directories of ``files`` files each (content: its own name), each to be moved into
    a trash tree of the same shape."""
    pairs = []
    for d in range(dirs):
        (tmp_path / "src" / str(d)).mkdir(parents=True)
        for i in range(files):
            name = f"src/{d}/{i}.delta"
            (tmp_path / name).write_bytes(name.encode())
            pairs.append((str(tmp_path / name), str(tmp_path / "trash" / name)))
    return pairs


def test_move_many_across_directories(tmp_path):
    """Several source directories (on one device: one after another; across devices, on threads, see
    test_cross_device_moves.py): every file reaches its destination with its content, the sources are gone,
    the ones that were never there are reported, and each move is counted."""
    fm, _ = _lean(tmp_path)
    pairs = _moves(tmp_path, 12, 25)
    gone = [(str(tmp_path / "src" / "3" / "absent"), str(tmp_path / "trash" / "src" / "3" / "absent")),
            (str(tmp_path / "src" / "nowhere" / "x"), str(tmp_path / "trash" / "src" / "nowhere" / "x"))]
    fm.counter.reset()
    missing = fm.move_many(pairs[:150] + gone + pairs[150:])
    assert sorted(missing) == sorted(src for src, _ in gone)
    for src, dst in pairs:
        assert not os.path.exists(src)
        assert open(dst, "rb").read() == os.path.relpath(src, tmp_path).encode()
        assert os.stat(dst).st_nlink == 1
    assert fm.counter.snapshot() == {"rename": len(pairs) + 2}
    # a destination that holds another file is replaced, as a rename replaces it
    (tmp_path / "again").write_bytes(b"new")
    assert fm.move_many([(str(tmp_path / "again"), pairs[0][1])]) == []
    assert open(pairs[0][1], "rb").read() == b"new" and not (tmp_path / "again").exists()


def test_move_many_killed_between_link_and_unlink_is_finished_by_the_next_call(tmp_path):
    """The crash switch counts the link and the unlink of each move: killed between the two, the file is
    under both names (one file, two links). The next call for the same moves finds the destination
    already linked to its source and only unlinks the source; the moves before the kill are done, the
    later ones untouched (one directory's files go in the order given)."""
    import signal
    import subprocess
    import sys

    pairs = _moves(tmp_path, 1, 5)
    code = ("import json, sys; from checkpoint_ops.storage import open_file_manager\n"
            "fm, root = open_file_manager(sys.argv[1]); fm.move_many([tuple(p) for p in json.loads(sys.argv[2])])\n")
    import json

    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="6")  # move i: points 2i+1 (link), 2i+2 (unlink)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path), json.dumps(pairs)], env=env, capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    (s0, d0), (s1, d1), (s2, d2), *later = pairs
    assert not os.path.exists(s0) and not os.path.exists(s1) and os.path.exists(d0) and os.path.exists(d1)
    assert os.path.samefile(s2, d2) and os.stat(s2).st_nlink == 2  # linked, not yet unlinked
    assert all(os.path.exists(s) and not os.path.exists(d) for s, d in later)

    fm, _ = _lean(tmp_path)
    assert fm.move_many(pairs) == [s0, s1]  # already moved: reported as not there, as before
    for src, dst in pairs:
        assert not os.path.exists(src) and os.stat(dst).st_nlink == 1
        assert open(dst, "rb").read() == os.path.relpath(src, tmp_path).encode()


def test_move_many_without_hard_links_renames(tmp_path, monkeypatch):
    """Where the file system refuses hard links (EPERM, as FAT or a protected_hardlinks policy does), each
    file is renamed instead."""
    fm, _ = _lean(tmp_path)
    pairs = _moves(tmp_path, 3, 4)

    def refuse(*_, **__):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    assert fm.move_many(pairs) == []
    assert all(not os.path.exists(s) and os.path.exists(d) for s, d in pairs)


def test_list_gives_names_at_once_and_each_files_size_and_mtime_when_asked(tmp_path):
    """``list`` reads a directory without a stat per file (a lease release lists a sink's root, which holds
    a file per batch); a file's size and mtime are read when first asked, and a file removed in between
    reads as empty with no mtime instead of failing the listing's caller."""
    fm, root = open_file_manager(str(tmp_path))
    (tmp_path / "a").write_bytes(b"12345")
    os.utime(tmp_path / "a", (1_700_000_000, 1_700_000_000))
    (tmp_path / "gone").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    listed = {f.name: f for f in fm.list(root)}
    os.remove(tmp_path / "gone")
    assert sorted(listed) == ["a", "gone", "sub"]
    assert (listed["a"].size, listed["a"].mtime, listed["a"].is_dir) == (5, 1_700_000_000, False)
    assert listed["sub"].is_dir
    assert (listed["gone"].size, listed["gone"].mtime, listed["gone"].error) == (0, None, None)
