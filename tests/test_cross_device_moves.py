"""Moves to another file system (fast tier, no Spark): a ``--keep-files`` directory on another device, or a
checkpoint directory that is a mount point (its trash, beside the checkpoint, is then on another device).

``LocalFileManager.move_many`` copies such a file (to a temp name, flushed to disk, renamed into place) and
only then unlinks the source. Killed between the two, the next call, as ``resume`` makes it, copies it again
over the destination and unlinks the source. Each test needs a second device: a tmpfs mounted for the test
(root only), else ``/dev/shm`` where it is one; without either it fails, saying what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from benchmarks import synthetic
from checkpoint_ops.storage import open_file_manager
from checkpoint_ops.storage.rename import across_temp_name
from tests.crash import ForkRunner, tree_digest
from tests.synthetic_sink import write_sink


def _mount_tmpfs(where: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    os.makedirs(where, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", where], capture_output=True)
    return mounted.returncode == 0


@contextlib.contextmanager
def _on_another_device(where: str, beside: str):
    """``where`` as a directory on another device than ``beside``: a tmpfs mounted there, or else a directory
    in ``/dev/shm`` (returned; the caller links ``where`` to it where it needs that name). Fails, saying what
    is missing, where the OS offers neither: these tests are the only ones of the cross-device path."""
    if _mount_tmpfs(where):
        try:
            yield where
        finally:
            subprocess.run(["umount", "-l", where], check=False)
        return
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(beside).st_dev):
        pytest.fail("no second file system: not root (cannot mount a tmpfs) and /dev/shm is missing, not "
                    "writable or on the same device as the test's directory; run the tests as root, or with a "
                    "writable /dev/shm")
    real = os.path.join(shm, f"checkpoint-ops-test-{os.getpid()}-{os.path.basename(where)}")
    shutil.rmtree(real, ignore_errors=True)
    os.makedirs(real)
    try:
        yield real
    finally:
        shutil.rmtree(real, ignore_errors=True)


@pytest.fixture
def elsewhere(tmp_path):
    """A directory on another device than ``tmp_path``."""
    with _on_another_device(str(tmp_path / "elsewhere"), str(tmp_path)) as d:
        yield d


def _files(folder: str, names: list[str]) -> list[tuple[str, str]]:
    os.makedirs(folder, exist_ok=True)
    for name in names:
        with open(f"{folder}/{name}", "w") as f:
            f.write(f"content of {name}")
    return [(f"{folder}/{name}", name) for name in names]


def test_move_many_across_devices_killed_between_copy_and_unlink_is_finished_by_the_next_call(tmp_path, elsewhere):
    """Killed after the copy of the 2nd file is in place and before its source is unlinked: both are whole;
    the next call (as ``resume`` makes it) copies it again over its destination, unlinks the source, moves
    the rest, and keeps each file's content, mode and mtime. (Before: EXDEV on every later call.)"""
    src = str(tmp_path / "src")
    pairs = [(path, f"{elsewhere}/keep/{name}") for path, name in _files(src, ["part-0", "part-1", "part-2"])]
    os.chmod(pairs[1][0], 0o640)
    os.utime(pairs[1][0], ns=(1_700_000_000_000_000_000, 1_700_000_000_123_456_789))
    code = ("import json, sys; from checkpoint_ops.storage import open_file_manager\n"
            "fm, root = open_file_manager(sys.argv[1]); fm.move_many([tuple(p) for p in json.loads(sys.argv[2])])\n")
    env = dict(os.environ, CHECKPOINT_OPS_KILL_AT="4")  # move i: points 2i+1 (the move), 2i+2 (before the unlink)
    p = subprocess.run([sys.executable, "-c", code, src, json.dumps(pairs)], env=env, capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    (s0, d0), (s1, d1), (s2, d2) = pairs
    assert not os.path.exists(s0) and os.path.exists(d0)
    assert open(s1).read() == open(d1).read() == "content of part-1"  # copied, not yet unlinked
    assert os.path.exists(s2) and not os.path.exists(d2)

    fm, _ = open_file_manager(src)
    assert fm.move_many(pairs) == [s0]  # already moved: reported as not there, as before
    assert os.listdir(src) == [] and sorted(os.listdir(f"{elsewhere}/keep")) == ["part-0", "part-1", "part-2"]
    for path, name in [(d0, "part-0"), (d1, "part-1"), (d2, "part-2")]:
        assert open(path).read() == f"content of {name}"
    st = os.stat(d1)
    assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o640, 1_700_000_000_123_456_789)


def test_move_many_across_devices_on_threads_finishes_what_crashes_left(tmp_path, elsewhere):
    """Several source directories (moved on several threads), across devices, with what crashes leave: a whole
    copy whose source was not yet unlinked, a copy cut short under its temp name, and an unrelated file where
    a source goes (replaced, as a rename replaces it). Every file ends at its destination, whole; no temp
    file, no source is left; a symbolic link is moved as the link."""
    pairs = []
    for d in range(6):
        pairs += [(path, f"{elsewhere}/trash/{d}/{name}") for path, name in
                  _files(str(tmp_path / "src" / str(d)), [f"{v}.delta" for v in range(5)])]
    os.makedirs(f"{elsewhere}/trash/0")
    shutil.copy2(pairs[0][0], pairs[0][1])  # a whole copy, killed before the unlink
    os.makedirs(f"{elsewhere}/trash/1")
    with open(f"{elsewhere}/trash/1/{across_temp_name('2.delta')}", "w") as f:  # a copy cut short
        f.write("cont")
    os.makedirs(f"{elsewhere}/trash/2")
    with open(f"{elsewhere}/trash/2/3.delta", "w") as f:
        f.write("another file")
    link = str(tmp_path / "src" / "3" / "link.delta")
    os.symlink("/nowhere/target", link)
    pairs.append((link, f"{elsewhere}/trash/3/link.delta"))

    fm, _ = open_file_manager(str(tmp_path))
    assert fm.move_many(pairs) == []
    for src, dst in pairs:
        assert not os.path.lexists(src)
        if src != link:
            assert open(dst).read() == f"content of {os.path.basename(src)}"
    assert os.readlink(f"{elsewhere}/trash/3/link.delta") == "/nowhere/target"
    assert not [n for _, _, names in os.walk(elsewhere) for n in names if n.endswith(".tmp")]


# ---- a rollback killed at each of its mutating calls, then resumed ------------------------------------------


def _crash_matrix(runner: ForkRunner, reset, command: list, recover: list, roots: list[str]) -> int:
    """Kill ``command`` at k = 1, 2, ... until it finishes; after each kill ``recover`` (or, where the kill
    came before any change, ``command`` again) must finish with exit 0 and leave exactly the tree of an
    uninterrupted run. Returns the number of crash points."""
    reset()
    code, out, err = runner.run(*command)
    assert code == 0, (out, err)
    expected = tree_digest(*roots)
    k = 1
    while True:
        reset()
        code, out, err = runner.run(*command, kill_at=k)
        if code != -signal.SIGKILL:
            assert code == 0, (k, out, err)
            assert tree_digest(*roots) == expected
            return k - 1
        code, out, err = runner.run(*recover)
        if code == 1 and ("nothing to resume" in err or "stopped before changing anything" in err):
            code, out, err = runner.run(*command)
        assert code == 0, f"recovery after a crash at k={k} failed: {out}{err}"
        got = tree_digest(*roots)
        assert got == expected, f"k={k}: {sorted(set(got.items()) ^ set(expected.items()))[:4]}"
        k += 1


@pytest.fixture(scope="module")
def runner():
    r = ForkRunner()
    yield r
    r.close()


def test_rollback_keep_files_on_another_device_crash_matrix(tmp_path, elsewhere, runner):
    """``rollback --keep-files`` on another device, killed at each mutating call (among them between the copy
    of each data file into the keep directory and the unlink of its source): ``rollback --resume`` always
    finishes it, to exactly the tree of an uninterrupted run (checkpoint, sink and keep directory)."""
    live, keep = str(tmp_path / "live"), f"{elsewhere}/keep"
    ck, out = f"{live}/ck", f"{live}/out"

    def reset():  # written in place each time: the sink log names its data files by absolute path
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(keep, ignore_errors=True)
        synthetic.write_local(ck, batches=5, partitions=1, retain_state=20)
        write_sink(out, 5)

    points = _crash_matrix(runner, reset, ["rollback", ck, "--to-batch", "2", "--sink", out, "--keep-files", keep,
                                           "--yes"], ["rollback", ck, "--resume"], [ck, out, keep])
    assert points > 0


def test_rollback_of_a_checkpoint_on_its_own_mount_crash_matrix(tmp_path, runner):
    """The checkpoint directory is a mount point (a disk of its own): its trash, beside it, is on another
    device, so every file the rollback removes is copied there, then unlinked. Killed at each mutating call,
    ``resume`` always finishes it, to exactly the tree of an uninterrupted run. As root a tmpfs is mounted there;
    else the checkpoint root is a link into /dev/shm, which puts its files on another device than its trash
    just the same."""
    base, live = str(tmp_path / "base"), str(tmp_path / "live")
    synthetic.write_local(f"{base}/ck", batches=5, partitions=1, retain_state=20)
    ck = f"{live}/ck"
    with _on_another_device(ck, str(tmp_path)) as real:
        if real != ck:  # /dev/shm: the checkpoint root is a link to it (a root may be one), its trash stays here
            os.makedirs(live, exist_ok=True)
            os.symlink(real, ck)

        def reset():
            shutil.rmtree(f"{live}/.checkpoint-ops", ignore_errors=True)
            for name in os.listdir(ck):
                path = f"{ck}/{name}"
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
            shutil.copytree(f"{base}/ck", ck, symlinks=True, dirs_exist_ok=True)

        points = _crash_matrix(runner, reset, ["rollback", ck, "--to-batch", "2", "--yes"], ["resume", ck], [ck])
        assert points > 0
