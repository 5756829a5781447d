"""The request folder: a drop box whose contents are never trusted.

Anyone who may drop a request may also drop a symbolic link, a directory, a FIFO or a 5 MB file. So:

* Every entry is judged by ``lstat``; a symbolic link, dangling or not, is never followed.
* A request is read through a descriptor opened with ``O_NOFOLLOW`` relative to the folder's own
  descriptor, only if it is still the regular file the listing saw, and at most ``MAX_REQUEST_BYTES`` of it
  (a bigger file is refused from its size, without being read).
* A request leaves the folder once, into one of ``OUTCOME_FOLDERS``, under its own name (a taken name
  gets ``.1``, ``.2``, ...). Its note ``<name>.reason.txt`` is published first (written to a hidden
  temporary file created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then hard-linked to its name, which
  never replaces or follows anything; its last line names the request file, its inode and mtime). Then the
  request is moved by ``renameat2(RENAME_NOREPLACE)``, which neither follows nor replaces anything
  (where the file system lacks it, e.g. NFS: a hard link, then the old name's removal). A move
  interrupted anywhere is finished by the next one, into the same name: a slot holding this request's
  note, or this very inode, is its own. So a request is moved exactly once, and never without its note.
* The outcome folders must be real directories of the folder: they are opened with ``O_NOFOLLOW |
  O_DIRECTORY`` (and created if missing); a symbolic link or a file in their place is refused
  (``UnsafeFolderError``) and nothing moves there until an operator fixes it.

The folder itself is configuration (``<home>/reprocess-requests``, a local directory) and is opened as
configured, links included; everything inside it is judged as above. It is not a checkpoint, and these
writes do not go through the ``CheckpointFileManager``: what they need (descriptor-relative, no-follow,
no-replace calls on a folder others write into) is not what that interface offers. This module holds no
Dagster: the sensor in ``reprocess.py`` decides what each entry means.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import uuid
from dataclasses import dataclass

from checkpoint_ops.storage.rename import RENAME_NOREPLACE, load_renameat2

REQUEST_SUFFIX = ".json"
NOTE_SUFFIX = ".reason.txt"
MAX_REQUEST_BYTES = 4096  # a request is a one-line JSON object; anything bigger is not one
HANDLED, FAILED, REJECTED = "handled", "failed", "rejected"
OUTCOME_FOLDERS = (HANDLED, FAILED, REJECTED)
MAX_NOTE_BYTES = 4096  # what the sensor writes in a note (longer reasons are cut)
MAX_SAME_NAME = 1000  # rejected/x.json, rejected/x.json.1, ... rejected/x.json.999

# What the sensor does with an entry (Entry.action).
READ = "read"  # a regular file named <something>.json: a request to read
REJECT = "reject"  # meant as a request but unusable, and safe to move: moved to rejected/ with the reason
LEAVE = "leave"  # not a request, or not safe to move: left alone, reported once
OWN = "own"  # one of the outcome folders, a real directory: nothing to say

FILE, SYMLINK, DIRECTORY, OTHER = "regular file", "symbolic link", "directory", "special file"

_NOFOLLOW_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never blocks us
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RequestFolderError(Exception):
    """Something in the request folder cannot be used as it is; the message says what and what to do."""


class UnsafeFolderError(RequestFolderError):
    """An outcome folder (``handled/``, ``failed/``, ``rejected/``) is not a real directory."""


class UnreadableRequestError(RequestFolderError):
    """A request file cannot be read as one: too big, replaced since the listing, or unreadable."""


class EntryChangedError(RequestFolderError):
    """The entry is no longer what the listing saw (replaced or gone): it is judged again next time."""


def shown(name: str) -> str:
    """A name as it may appear in a log line or a note: control characters and undecodable bytes escaped."""
    return name if name.isprintable() else ascii(name)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISLNK(mode):
        return SYMLINK
    if stat.S_ISDIR(mode):
        return DIRECTORY
    return OTHER


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept by os.listdir as lone surrogates
        return False
    return name.isprintable()


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in the request folder as ``lstat`` saw it, and what the sensor does with it."""

    name: str
    kind: str  # FILE | SYMLINK | DIRECTORY | OTHER
    action: str  # READ | REJECT | LEAVE | OWN
    reason: str  # why it is rejected or left alone ("" for READ and OWN)
    device: int
    inode: int
    size: int

    @property
    def identity(self) -> str:
        """Name, kind and inode: the same string while the same thing stays under the same name."""
        return f"{self.name}\0{self.kind}\0{self.device}:{self.inode}"

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "action": self.action, "reason": self.reason,
                "size": self.size}


def classify(name: str, st: os.stat_result) -> Entry:
    """What ``name`` (with its ``lstat`` result) is to the sensor.

    * ``handled``/``failed``/``rejected``: OWN when a real directory, else LEAVE (and nothing moves there);
    * a printable name ending in ``.json``, not hidden: READ when a regular file; REJECT when a symbolic
      link (the link itself is moved, never what it points to); LEAVE when a directory or a special file;
    * a name ending in ``.JSON`` or another case variant: REJECT (regular file or link), else LEAVE;
    * everything else (hidden names, other suffixes, unprintable names): LEAVE.
    """
    kind = _kind(st.st_mode)

    def entry(action: str, reason: str = "") -> Entry:
        return Entry(name, kind, action, reason, st.st_dev, st.st_ino, st.st_size)

    if name in OUTCOME_FOLDERS:
        if kind == DIRECTORY:
            return entry(OWN)
        return entry(LEAVE, f"a {kind}, not a directory: requests are moved into {name}/ only when it is a real "
                     f"directory; remove it (the sensor creates {name}/)")
    movable = kind in (FILE, SYMLINK)
    not_moved = f"a {kind} is never read nor moved; remove it"
    if name.startswith("."):
        return entry(LEAVE, "a hidden name is not a request (not read; rename it to <id>.json once it is "
                     "complete)")
    if not _encodable(name):
        return entry(LEAVE, "the name has control characters or is not UTF-8; rename it to <id>.json")
    if name.endswith(REQUEST_SUFFIX):
        if kind == FILE:
            return entry(READ)
        if kind == SYMLINK:
            return entry(REJECT, "a symbolic link, not a regular file: requests are read from regular files only "
                         "and links are never followed; copy the request into the folder instead")
        return entry(LEAVE, f"a {kind} named like a request: {not_moved}")
    if name.lower().endswith(REQUEST_SUFFIX):
        fixed = name[: -len(REQUEST_SUFFIX)] + REQUEST_SUFFIX
        if movable:
            return entry(REJECT, f"the name must end in lowercase {REQUEST_SUFFIX}: drop it again as {fixed}")
        return entry(LEAVE, f"a {kind} named like a request (and not in lowercase .json): {not_moved}")
    return entry(LEAVE, f"not a request (a {kind}; a request is a regular file named <id>{REQUEST_SUFFIX})")


def note_text(note: str, name: str, st: os.stat_result) -> str:
    """A note as published beside a moved request: ``note``, then a last line naming the request file, its
    inode and modification time (``st``: its ``lstat``), by which an interrupted move of that very file
    recognises its own note."""
    return f"{note.rstrip()}\nrequest file: {shown(name)} (inode {st.st_dev}:{st.st_ino}, mtime {st.st_mtime_ns})\n"


@dataclass(frozen=True, slots=True)
class Moved:
    """Where a request went; its note is ``dest + NOTE_SUFFIX``."""

    source: str  # name in the request folder
    dest: str  # path relative to the request folder, e.g. "handled/x.json.1"
    resumed: bool  # an interrupted move of this very file was finished

    @property
    def note(self) -> str:
        return self.dest + NOTE_SUFFIX

    def to_dict(self) -> dict:
        return {"source": self.source, "dest": self.dest, "note": self.note, "resumed": self.resumed}


class RequestFolder:
    """The open request folder. Use as a context manager; every operation is relative to its descriptor.

    .. code-block:: python

        with RequestFolder.open(path) as folder:
            for entry in folder.entries():
                if entry.action == READ:
                    data = folder.read(entry)
                    folder.move(entry, HANDLED, "run 1234 succeeded")
    """

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd
        self._outcome_fds: dict[str, int] = {}

    @classmethod
    def open(cls, path: str) -> "RequestFolder":
        """FileNotFoundError when the folder does not exist yet; the folder itself may be a configured link."""
        return cls(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    def close(self) -> None:
        for fd in self._outcome_fds.values():
            os.close(fd)
        self._outcome_fds.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "RequestFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def where(self, rel: str) -> str:
        """A path under the folder, for messages."""
        return os.path.join(self.path, rel)

    # -- reading -----------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every name in the folder, judged by ``lstat``, sorted by name (a name gone meanwhile is skipped)."""
        out = []
        for name in sorted(os.listdir(self._fd)):
            try:
                st = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            out.append(classify(name, st))
        return out

    def read(self, entry: Entry, limit: int = MAX_REQUEST_BYTES) -> bytes:
        """The bytes of a READ entry: at most ``limit``; a bigger file is refused without being read.

        Raises UnreadableRequestError (with the reason for a note) or EntryChangedError.
        """
        if entry.size > limit:
            raise UnreadableRequestError(f"{entry.size} bytes: a request is at most {limit} bytes (a JSON object "
                                         "with asset, to_batch or to_time, and id); it was not read")
        try:
            fd = os.open(entry.name, _NOFOLLOW_READ, dir_fd=self._fd)
        except FileNotFoundError:
            raise EntryChangedError(f"{shown(entry.name)} is gone") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link: replaced since the listing
                raise EntryChangedError(f"{shown(entry.name)} was replaced by a symbolic link") from None
            raise UnreadableRequestError(f"cannot be opened ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (entry.device, entry.inode):
                raise EntryChangedError(f"{shown(entry.name)} was replaced since the folder was listed")
            chunks, left = [], limit + 1
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        if len(data) > limit:
            raise UnreadableRequestError(f"more than {limit} bytes (it grew while being read): a request is at most "
                                         f"{limit} bytes; it was not read whole")
        return data

    # -- moving ------------------------------------------------------------------------------
    def outcome_folder(self, folder: str) -> int:
        """The descriptor of ``folder`` (one of OUTCOME_FOLDERS), created if missing; never through a link."""
        if folder not in OUTCOME_FOLDERS:
            raise ValueError(f"not an outcome folder: {folder!r}")
        if folder in self._outcome_fds:
            return self._outcome_fds[folder]
        try:
            os.mkdir(folder, 0o777, dir_fd=self._fd)
        except FileExistsError:
            pass  # a directory already (opened below), or something else (refused below)
        except OSError as e:
            raise RequestFolderError(f"{self.where(folder)} cannot be created ({e.strerror}): create it, writable "
                                     "by the sensor; until then the requests that belong there stay") from None
        try:
            fd = os.open(folder, _DIR_FLAGS, dir_fd=self._fd)
        except OSError as e:
            st = _lstat(self._fd, folder)
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise RequestFolderError(f"{self.where(folder)} cannot be opened ({e.strerror}): make it readable "
                                         "and writable by the sensor") from None
            what = f"a {_kind(st.st_mode)}" if st is not None else "gone"
            raise UnsafeFolderError(
                f"{self.where(folder)} is {what}, not a directory: requests are never moved through it. Remove it "
                f"(the sensor creates {folder}/ itself); until then the requests that belong there stay where "
                "they are") from None
        self._outcome_fds[folder] = fd
        return fd

    def move(self, entry: Entry, folder: str, note: str) -> Moved:
        """Move ``entry`` into ``folder`` with ``note`` beside it, exactly once.

        The note is published first (its last line identifies the request file), then the name
        is moved without replacing anything: ``renameat2(RENAME_NOREPLACE)``, or where the file system
        lacks it (NFS) a hard link and then the removal of the old name. A move interrupted anywhere is
        finished by the next call: a slot holding this request's note, or this very inode, is its own.
        Raises UnsafeFolderError (``folder`` is not a real directory), EntryChangedError (the name no
        longer holds what the listing saw: judged again next time) or RequestFolderError (no free name).
        """
        dest_fd = self.outcome_folder(folder)
        src = self._current(entry)
        body = note_text(note, entry.name, src)
        marker = body.rstrip("\n").rsplit("\n", 1)[-1]
        for n in range(MAX_SAME_NAME):
            slot = entry.name if n == 0 else f"{entry.name}.{n}"
            there = _lstat(dest_fd, slot)
            if there is not None:
                if os.path.samestat(there, src):  # linked there, old name not yet removed: finish
                    if self._note_state(dest_fd, slot + NOTE_SUFFIX, marker) is None:
                        self._publish_note(dest_fd, slot + NOTE_SUFFIX, body)
                    self._remove_source(entry.name)
                    return Moved(entry.name, f"{folder}/{slot}", True)
                continue
            mine = self._note_state(dest_fd, slot + NOTE_SUFFIX, marker)
            if mine is False:
                continue  # a note (or anything planted under its name) without its request: leave both alone
            if mine is None and not self._publish_note(dest_fd, slot + NOTE_SUFFIX, body):
                continue  # the note's name was taken meanwhile
            if self._move_name(dest_fd, entry.name, slot):
                return Moved(entry.name, f"{folder}/{slot}", bool(mine))
        raise RequestFolderError(f"{self.where(folder)} already holds {MAX_SAME_NAME} requests named "
                                 f"{shown(entry.name)}: move some away, then the sensor moves this one")

    def _current(self, entry: Entry) -> os.stat_result:
        st = _lstat(self._fd, entry.name)
        if st is None:
            raise EntryChangedError(f"{shown(entry.name)} is gone")
        if (st.st_dev, st.st_ino) != (entry.device, entry.inode) or _kind(st.st_mode) != entry.kind:
            raise EntryChangedError(f"{shown(entry.name)} was replaced since the folder was listed")
        return st

    def _move_name(self, dest_fd: int, name: str, slot: str) -> bool:
        """Move ``name`` to ``slot`` in the outcome folder unless ``slot`` exists; False if it does."""
        if _renameat2 is not None:
            if _renameat2(self._fd, os.fsencode(name), dest_fd, os.fsencode(slot), _RENAME_NOREPLACE) == 0:
                os.fsync(dest_fd)
                os.fsync(self._fd)
                return True
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                return False
            if err == errno.ENOENT:
                raise EntryChangedError(f"{shown(name)} is gone")
            if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise OSError(err, os.strerror(err), self.where(name))
        try:  # no renameat2 here: link (never replaces, never follows), then remove the old name
            os.link(name, slot, src_dir_fd=self._fd, dst_dir_fd=dest_fd, follow_symlinks=False)
        except FileExistsError:
            return False
        os.fsync(dest_fd)
        self._remove_source(name)
        return True

    def _remove_source(self, name: str) -> None:
        os.unlink(name, dir_fd=self._fd)
        os.fsync(self._fd)

    @staticmethod
    def _note_state(dest_fd: int, note_name: str, marker: str) -> bool | None:
        """None: no such name; True: a note this request's interrupted move published; False: anything else."""
        st = _lstat(dest_fd, note_name)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4 * MAX_NOTE_BYTES:
            return False
        try:
            fd = os.open(note_name, _NOFOLLOW_READ, dir_fd=dest_fd)
        except OSError:
            return False
        try:
            text = os.read(fd, 4 * MAX_NOTE_BYTES).decode("utf-8", "replace")
        finally:
            os.close(fd)
        return text.rstrip("\n").rsplit("\n", 1)[-1] == marker

    @staticmethod
    def _publish_note(dest_fd: int, note_name: str, body: str) -> bool:
        """Write ``note_name`` whole or not at all; False when the name is taken (nothing is written then)."""
        tmp = f".{note_name}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=dest_fd)
        try:
            try:
                data = body.encode("utf-8", "backslashreplace")
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, note_name, src_dir_fd=dest_fd, dst_dir_fd=dest_fd, follow_symlinks=False)
                return True
            except FileExistsError:
                return False
        finally:
            os.unlink(tmp, dir_fd=dest_fd)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


_RENAME_NOREPLACE = RENAME_NOREPLACE
_renameat2 = load_renameat2()
