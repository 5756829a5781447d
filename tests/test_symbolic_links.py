"""Symbolic links inside a checkpoint (fast tier, no Spark).

Spark follows a symbolic link to a directory (``state/`` on another disk, say); checkpoint-ops does not
operate through one: every command refuses the checkpoint by the link's name and target, and changes
nothing. A symbolic link to a file is read through, and moved or deleted as the link itself.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from benchmarks import synthetic
from checkpoint_ops.storage import open_file_manager
from tests.helpers import cli, cli_json, tree_snapshot
from tests.synthetic_sink import write_sink


def test_walk_lists_a_linked_directory_as_itself_and_follows_the_root(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "a").write_bytes(b"a")
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere" / "deep" / "b").write_bytes(b"b")
    (tmp_path / "file-elsewhere").write_bytes(b"content")
    os.symlink(tmp_path / "elsewhere", real / "linked-dir")
    os.symlink(tmp_path / "file-elsewhere", real / "sub" / "linked-file")
    os.symlink(tmp_path / "nowhere", real / "dangling")
    os.symlink(real / "loop", real / "loop")
    os.symlink(real, tmp_path / "root-link")

    fm, root = open_file_manager(str(tmp_path / "root-link"))
    found = {os.path.relpath(f.path, root): f for f in fm.walk(root, empty_dirs=True)}
    assert sorted(found) == ["dangling", "linked-dir", "loop", "sub/a", "sub/linked-file"]  # the link is not entered
    link = found["linked-dir"]
    assert link.is_dir and link.link_target == str(tmp_path / "elsewhere")
    assert not found["sub/linked-file"].is_dir and found["sub/linked-file"].size == len(b"content")
    assert found["dangling"].link_target is None and not found["dangling"].is_dir  # damage: a file that is not there
    assert found["loop"].link_target is None and found["loop"].error.errno == errno.ELOOP  # damage too
    assert found["sub/a"].link_target is None
    listed = {f.name: f for f in fm.list(root)}  # one directory: the same entries
    assert sorted(listed) == ["dangling", "linked-dir", "loop", "sub"]
    assert listed["linked-dir"].link_target == str(tmp_path / "elsewhere") and not listed["loop"].is_dir
    assert listed["sub"].is_dir and listed["dangling"].mtime is None and listed["loop"].error.errno == errno.ELOOP
    in_sub = {f.name: f for f in fm.list(os.path.join(root, "sub"))}  # a link to a file: read through, as walk does
    linked, walked = in_sub["linked-file"], found["sub/linked-file"]
    assert (linked.size, linked.mtime, linked.is_dir) == (walked.size, walked.mtime, False) == \
        (len(b"content"), os.stat(tmp_path / "file-elsewhere").st_mtime, False)


def _checkpoint_with_linked_state(tmp_path) -> tuple[str, str]:
    ck, disk = str(tmp_path / "ck"), str(tmp_path / "bigdisk")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    os.makedirs(disk)
    os.rename(f"{ck}/state", f"{disk}/state")
    os.symlink(f"{disk}/state", f"{ck}/state")
    return ck, disk


COMMANDS = {  # name -> arguments, given the checkpoint and a backup destination
    "inspect": lambda ck, dest: ["inspect", ck],
    "fsck": lambda ck, dest: ["fsck", ck],
    "rollback": lambda ck, dest: ["rollback", ck, "--to-batch", "8", "--yes"],
    "rollback-dry-run": lambda ck, dest: ["rollback", ck, "--to-batch", "8", "--dry-run"],
    "backup-create": lambda ck, dest: ["backup", "create", ck, dest],
    "resume": lambda ck, dest: ["resume", ck],
    "undo": lambda ck, dest: ["undo", ck, "--yes"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_checkpoint_with_a_linked_directory(tmp_path, command):
    """state/ a link to another disk: no command calls it stateless or healthy, rolls back without its state
    (a restart would load the abandoned timeline's state), or half backs it up; each names the link and its
    target, says what to do, and changes nothing."""
    ck, disk = _checkpoint_with_linked_state(tmp_path)
    before = tree_snapshot(ck, disk)
    code, out, err = cli(*COMMANDS[command](ck, str(tmp_path / "dest")))
    assert code == 2, (out, err)
    assert f"{ck}/state: a symbolic link to {disk}/state" in err
    assert "does not operate through symbolic links" in err and "fix:" in err
    assert "healthy" not in out and "stateless" not in out
    assert tree_snapshot(ck, disk) == before
    assert sorted(os.listdir(f"{disk}/state/0/0")).count("12.delta") == 1  # the abandoned state is untouched
    assert not os.path.exists(tmp_path / "dest") or not os.listdir(tmp_path / "dest")


def test_linked_files_are_read_through_and_moved_as_links(tmp_path):
    """A link to a file (a batch's offsets, a state delta): inspected and checked through the link; a rollback
    moves the link itself into the trash and an undo puts it back (the file it points to is never touched); a
    backup holds the content, restored as a plain file."""
    ck, other = str(tmp_path / "ck"), str(tmp_path / "other")
    synthetic.write_local(ck, batches=6, partitions=2, retain_state=20)
    os.makedirs(other)
    linked = ["offsets/5", "state/0/0/6.delta", "state/0/0/4.delta"]
    for rel in linked:
        os.rename(f"{ck}/{rel}", f"{other}/{rel.replace('/', '_')}")
        os.symlink(f"{other}/{rel.replace('/', '_')}", f"{ck}/{rel}")
    targets = tree_snapshot(other)

    code, out, _ = cli("fsck", ck)
    assert code == 0 and "healthy" in out, out
    code, out, err = cli("backup", "create", ck, str(tmp_path / "dest"))
    assert code == 0, err
    code, out, err = cli("rollback", ck, "--to-batch", "3", "--yes")
    assert code == 0, err
    assert not os.path.lexists(f"{ck}/offsets/5") and not os.path.lexists(f"{ck}/state/0/0/6.delta")
    assert os.path.islink(f"{ck}/state/0/0/4.delta")  # kept: batch 3 is committed from version 4 on
    code, out, err = cli("undo", ck, "--yes")
    assert code == 0, err
    for rel in linked:
        assert os.readlink(f"{ck}/{rel}") == f"{other}/{rel.replace('/', '_')}"
    assert tree_snapshot(other) == targets

    backup_id = os.listdir(tmp_path / "dest" / "manifests")[0].removesuffix(".json")
    code, out, err = cli("backup", "restore", str(tmp_path / "dest"), backup_id, str(tmp_path / "restored"), "--yes")
    assert code == 0, err
    restored = tmp_path / "restored" / "offsets" / "5"
    assert not restored.is_symlink() and restored.read_bytes() == open(f"{other}/offsets_5", "rb").read()


def test_a_sink_output_with_a_linked_directory_is_refused(tmp_path):
    """The same rule for a file sink's output: a partition directory linked elsewhere holds data files the
    listing would not see (a rollback would leave them, and the restarted query write them again)."""
    ck, out, disk = str(tmp_path / "ck"), str(tmp_path / "out"), str(tmp_path / "disk")
    synthetic.write_local(ck, batches=6, partitions=2, retain_state=20)
    written = write_sink(out, 6, folders={5: "day=2"})
    os.makedirs(disk)
    os.rename(os.path.dirname(written[5]), f"{disk}/day=2")
    os.symlink(f"{disk}/day=2", f"{out}/day=2")
    before = tree_snapshot(ck, out, disk)
    code, _, err = cli("rollback", ck, "--to-batch", "3", "--sink", out, "--yes")
    assert code == 2, err
    assert f"{out}/day=2: a symbolic link to {disk}/day=2" in err and "inside a sink output" in err
    assert tree_snapshot(ck, out, disk) == before


@pytest.mark.parametrize("spelling", ["linked-parent", "double-slashes"])
def test_undo_through_another_spelling_of_the_checkpoint_takes_one_lease(tmp_path, spelling):
    """A rollback given the real path, its undo given the same checkpoint through a symbolic link to a parent
    (or as ``//``): one place, one lease. The undo used to take the checkpoint's lease under each spelling, the
    journal's and the command line's, and refused with the lease it had just taken itself."""
    real = tmp_path / "disk"
    ck = str(real / "ck")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    os.symlink(real, tmp_path / "link")
    other = str(tmp_path / "link" / "ck") if spelling == "linked-parent" else f"/{real}//ck"
    before = tree_snapshot(ck)
    code, out, err = cli("rollback", ck, "--to-batch", "8", "--yes")
    assert code == 0, err
    code, out, err = cli("undo", other, "--yes")
    assert code == 0, (out, err)
    assert "in use" not in err
    after = tree_snapshot(ck)
    changed = {p for p in before.keys() | after.keys() if before.get(p, (None,))[0] != after.get(p, (None,))[0]}
    assert not {p for p in changed if "/.checkpoint-ops" not in p}, sorted(changed)
    code, out, err = cli("lease", "show", ck)
    assert code == 0 and "free" in out, (out, err)


def test_a_restore_refuses_a_sink_target_that_is_its_checkpoint_target_through_a_link(tmp_path):
    """The checkpoint target and a sink target one place through a symbolic link: the restore wrote both into one
    directory (the targets were compared as typed; one lease per place let it through). Refused by place: exit 2,
    nothing written."""
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    write_sink(out, 12, compact_interval=10)
    code, made = cli_json("backup", "create", ck, str(tmp_path / "bk"), "--sink", out)
    assert code == 0, made
    os.makedirs(tmp_path / "r")
    os.symlink(tmp_path / "r", tmp_path / "rl")
    for sink_target, how in ((tmp_path / "rl" / "x", "is the same place as"),
                             (tmp_path / "rl" / "x" / "out", "contains")):
        code, r = cli_json("backup", "restore", str(tmp_path / "bk"), made["backup_id"], str(tmp_path / "r" / "x"),
                           "--sink-target", str(sink_target), "--yes")
        assert code == 2 and how in r["problem"], r
        assert os.listdir(tmp_path / "r") == [], os.listdir(tmp_path / "r")


@pytest.mark.parametrize("again", ["link", "same", "slashes"])
def test_a_sink_given_twice_is_refused_before_anything_changes(tmp_path, again):
    """One output given twice to a rollback (through a link, or as typed twice): each copy was planned blind to the
    other, the rollback deleted data files of batches it keeps, and its undo was refused as incomplete (the files
    sat in two trashes). Refused: exit 2, nothing changed; the same for fsck and backup create."""
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    write_sink(out, 12)
    os.symlink(out, tmp_path / "outlink")
    twice = {"link": str(tmp_path / "outlink"), "same": out, "slashes": f"/{out}/"}[again]
    before = tree_snapshot(ck, out)
    for args in (["rollback", ck, "--to-batch", "8", "--yes"], ["fsck", ck],
                 ["backup", "create", ck, str(tmp_path / "bk")]):
        code, r = cli_json(*args, "--sink", out, "--sink", twice)
        assert code == 2, (args, r)
        assert f"--sink {twice} " in r["problem"] and "each output is given once" in r["problem"], r
    assert tree_snapshot(ck, out) == before
    assert not os.path.exists(tmp_path / "bk")


def test_a_fenced_checkpoint_named_through_another_link_is_told_where_its_journal_is(tmp_path):
    """The checkpoint directory is itself a symbolic link, and a rollback given the link was killed after its fence:
    its journal is beside the link. fsck given the real directory advised `resume <real>`, which finds no journal
    there (a hostile review). The advice names the spelling the rollback ran under, and that resume finishes it."""
    import subprocess
    import sys

    real, link = str(tmp_path / "data" / "ck"), str(tmp_path / "cklink")
    synthetic.write_local(real, batches=12, partitions=2, retain_state=20)
    os.symlink(real, link)
    trace = str(tmp_path / "trace.txt")
    shutil.copytree(real, str(tmp_path / "traced" / "ck"))
    os.symlink(str(tmp_path / "traced" / "ck"), str(tmp_path / "tracedlink"))
    done = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", str(tmp_path / "tracedlink"),
                           "--to-batch", "8", "--yes"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CHECKPOINT_OPS_KILL_AT="1000000", CHECKPOINT_OPS_KILL_TRACE=trace))
    assert done.returncode == 0, done.stderr
    fence = [int(line.split("\t")[0]) for line in open(trace) if line.rstrip().endswith("/metadata")][0]
    killed = subprocess.run([sys.executable, "-m", "checkpoint_ops.cli", "rollback", link, "--to-batch", "8", "--yes"],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, CHECKPOINT_OPS_KILL_AT=str(fence + 1)))
    assert killed.returncode == -9, killed.stderr

    code, report = cli_json("fsck", real)
    (finding,) = [f for f in report["findings"] if f["code"] == "operation-interrupted"]
    assert f"`checkpoint-ops resume {link}`" in finding["fix"] and "copied" not in finding["fix"], finding
    code, r = cli_json("inspect", real)
    assert f"`checkpoint-ops resume {link}`" in r["fenced"]["fix"], r["fenced"]
    for command in ("resume", "undo"):  # given the real path: they find no journal there, and say where it is
        code, r = cli_json(command, real, "--yes")
        assert code == 2 and f"`checkpoint-ops resume {link}`" in r["fix"], r
        assert "restore the checkpoint from a backup" not in r["fix"], r
    os.rename(link, link + ".bak")  # the link it ran under, gone: not "copied", but make the link again
    code, report = cli_json("fsck", real)
    (finding,) = [f for f in report["findings"] if f["code"] == "operation-interrupted"]
    assert f"ran under the name {link}, which is gone" in finding["fix"] and "copied" not in finding["fix"], finding
    assert f"`ln -s {real} {link}`" in finding["fix"], finding
    os.rename(link + ".bak", link)
    code, r = cli_json("resume", link, "--yes")
    assert code == 0, r
    assert cli_json("fsck", real)[0] == 0


@pytest.mark.parametrize("log", ["whole", "damaged"])
def test_a_sink_named_through_a_link_is_rolled_back_by_its_log(tmp_path, log):
    """The sink output given through a symbolic link to it: its log names the files under the real path, which were
    read as lying elsewhere. With a damaged log (a compact file missing) the rollback planned deleting every data
    file, the kept batches' too (a hostile review); with a whole one it was refused as a copied output. Entries are
    now related to the output by place: the rollback deletes the removed batches' files alone, and undo puts them
    back."""
    ck, out, link = str(tmp_path / "ck"), str(tmp_path / "out"), str(tmp_path / "outlink")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    written = write_sink(out, 12, compact_interval=10 if log == "whole" else None)
    os.symlink(out, link)
    before = tree_snapshot(ck, out)
    code, r = cli_json("rollback", ck, "--sink", link, "--to-batch", "8", "--yes")
    assert code == 0, r
    gone = {os.path.basename(written[b]) for b in (9, 10, 11)}
    kept = {os.path.basename(written[b]) for b in range(9)}
    data = {n for n in os.listdir(out) if n.startswith("part-")}
    assert data == kept and not gone & data, sorted(data)
    code, r = cli_json("undo", ck, "--yes")
    assert code == 0, r
    after = tree_snapshot(ck, out)
    changed = {p for p in before.keys() | after.keys() if before.get(p, (None,))[0] != after.get(p, (None,))[0]}
    assert not {p for p in changed if ".checkpoint-ops" not in p}, sorted(changed)


def test_a_backup_refuses_a_sink_named_other_than_its_log_names_it(tmp_path):
    """`backup create --sink <a link to the output>`: the manifest recorded the link's name as where the files live
    while the log names the real path, and the backup could not be restored without a --relocate the errors never
    named (a hostile review). Refused before anything is written, naming the path the log uses."""
    ck, out, link = str(tmp_path / "ck"), str(tmp_path / "out"), str(tmp_path / "outlink")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    write_sink(out, 12, compact_interval=10)
    os.symlink(out, link)
    code, r = cli_json("backup", "create", ck, str(tmp_path / "bk"), "--sink", link)
    assert code == 2 and f"names its files under {out}" in r["problem"], r
    assert r["fix"] == f"give --sink {out} (the name the query writes to)", r
    assert not os.path.exists(tmp_path / "bk")
    code, r = cli_json("backup", "create", ck, str(tmp_path / "bk"), "--sink", out)
    assert code == 0, r
