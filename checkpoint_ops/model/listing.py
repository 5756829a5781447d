"""One recursive listing of a directory tree, indexed for the model.

Everything the model knows about which files exist comes from a single ``walk`` (one paginated
LIST on object stores), so inspecting or planning never lists the same prefix twice.

A symbolic link to a directory inside the tree is not entered by the walk: the listing keeps it in
``dir_links``, neither a file nor a directory of the model, and every command refuses such a tree by
name (``require_no_dir_links``) rather than act on part of what Spark reads. The listed root itself
may be a link.
"""

from __future__ import annotations

from typing import Iterator

from ..errors import BadInputError
from ..storage import CheckpointFileManager, FileInfo
from ..storage.checksums import hadoop_crc_target, is_hadoop_crc_name


_LONG_RANGE = range(-(1 << 63), 1 << 63)


def spark_batch_id(name: str) -> int | None:
    """The batch id Spark's ``isBatchFile`` reads in ``name`` (Java's ``toLong``: decimal digits, Unicode ones
    too but only those of one UTF-16 unit, an optional ``-``, within 64 bits), or None. A leading ``+``, which
    Java also accepts, is not read (``listed_batch_id`` reads it)."""
    if name.isascii():  # the names Spark writes: no per-character test (a listing holds one per batch file)
        if not name.isdigit():
            if not (name[:1] == "-" and name[1:].isdigit()):
                return None
        elif len(name) < 19:  # under 10**18: within a long
            return int(name)
        value = int(name)
        return value if value in _LONG_RANGE else None
    digits = name[1:] if name[:1] == "-" else name
    if not digits.isdecimal():  # not isdigit(): "²" is a digit that int() refuses
        return None
    if not all(ch < "\U00010000" for ch in digits):  # Java reads UTF-16 units: "𝟑" is two, neither a digit
        return None
    value = int(name)
    return value if value in _LONG_RANGE else None


def listed_batch_id(name: str) -> int | None:
    """The batch id Spark's ``isBatchFile`` lists ``name`` as, a leading ``+`` included (Java's ``toLong``
    takes ``+31`` for 31), or None."""
    return spark_batch_id(name[1:] if name[:1] == "+" and name[1:2] != "-" else name)


def misnamed_batch_id(name: str) -> int | None:
    """The batch id of a name Spark lists as a batch but does not read that batch from (``031``, ``+31``,
    Unicode digits, ``-0``): Spark reads batch N from the file named ``str(N)`` only. None for any other name."""
    batch = listed_batch_id(name)
    return batch if batch is not None and str(batch) != name else None


# What Spark requires to be empty (or absent) to start a new query at a checkpoint location (Listing.blocks_new_query)
NEW_QUERY_EMPTY_DIRS = ("offsets", "commits", "state")

# The lease and takeover claims of lease.py (and their Hadoop .crc sidecars), in the listed root only.
OWN_FILE_PREFIXES = (".checkpoint-ops.lease", "..checkpoint-ops.lease")


def is_hidden_temp(name: str) -> bool:
    """Whether ``name`` is a hidden ``.*.tmp`` file: the temp file of a write that never finished (Spark's
    or ours). Spark never reads one; its Hadoop ``.crc`` sidecar, if any, goes with it."""
    return name.startswith(".") and name.endswith(".tmp")


def is_unfinished_write(name: str) -> bool:
    """Whether ``name`` is a hidden ``.*.tmp`` file or the Hadoop ``.crc`` sidecar of one (``..*.tmp.crc``)."""
    return is_hidden_temp(name) or (is_hadoop_crc_name(name) and is_hidden_temp(hadoop_crc_target(name)))


class Listing:
    """Files under ``root``, keyed by path relative to ``root`` ("offsets/5")."""

    def __init__(self, fm: CheckpointFileManager, root: str, files: list[FileInfo]):
        self.fm = fm
        self.root = root.rstrip("/")
        self.files: dict[str, FileInfo] = {}
        self._children: dict[str, dict[str, FileInfo]] = {}
        self._subdirs: dict[str, set[str]] | None = None  # derived from _children when first needed
        self.empty_dirs: dict[str, FileInfo] = {}  # rel -> entry, where the walk reports them
        self.own: dict[str, FileInfo] = {}  # our lease files in the root (lease.py), kept out of the model
        self.unreadable_dirs: dict[str, OSError] = {}  # rel ("" for the root) -> why the walk could not list it
        self.dir_links: dict[str, str] = {}  # rel -> target: symbolic links to directories, not entered
        cut = len(self.root) + 1
        prefix = self.root + "/"
        files_ = self.files
        children = self._children
        for f in files:
            path = f.path
            if f.is_dir and f.error is not None and (path.rstrip("/") == self.root or path.startswith(prefix)):
                self.unreadable_dirs[path.rstrip("/")[cut:]] = f.error
            if not path.startswith(prefix):
                continue
            rel = path[cut:]
            if rel.startswith(OWN_FILE_PREFIXES):
                self.own[rel] = f  # our lease (and its checksum sidecar): not part of what Spark reads
                continue
            if f.is_dir:
                if f.link_target is not None:
                    self.dir_links[rel] = f.link_target
                    continue
                self.empty_dirs[rel] = f
                continue
            files_[rel] = f
            parent, _, name = rel.rpartition("/")
            d = children.get(parent)
            if d is None:
                d = children[parent] = {}
            d[name] = f

    def _dirs(self) -> dict[str, set[str]]:
        if self._subdirs is None:
            subdirs: dict[str, set[str]] = {}
            for parent in self._children:
                while parent:
                    up, _, dname = parent.rpartition("/")
                    subs = subdirs.setdefault(up, set())
                    if dname in subs:
                        break
                    subs.add(dname)
                    parent = up
            for rel in self.empty_dirs:
                up, _, dname = rel.rpartition("/")
                subdirs.setdefault(up, set()).add(dname)
            self._subdirs = subdirs
        return self._subdirs

    @classmethod
    def scan(cls, fm: CheckpointFileManager, root: str) -> "Listing":
        return cls(fm, root, fm.walk(root, empty_dirs=True))

    def dir_entry(self, rel: str) -> FileInfo | None:
        """A stand-in entry for a directory at ``rel`` (where a file may be expected), or None."""
        if rel in self.empty_dirs:
            return self.empty_dirs[rel]
        if self.has_dir(rel):
            return FileInfo(self.abs(rel), 0, None, is_dir=True)
        return None

    def abs(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url(self, rel: str) -> str:
        return self.fm.url(self.abs(rel))

    def get(self, rel: str) -> FileInfo | None:
        return self.files.get(rel)

    def __contains__(self, rel: str) -> bool:
        return rel in self.files

    def files_in(self, rel_dir: str) -> dict[str, FileInfo]:
        """Direct child files of ``rel_dir``: name -> FileInfo."""
        return self._children.get(rel_dir.strip("/"), {})

    def subdirs(self, rel_dir: str) -> list[str]:
        return sorted(self._dirs().get(rel_dir.strip("/"), ()))

    def has_dir(self, rel_dir: str) -> bool:
        rel_dir = rel_dir.strip("/")
        return rel_dir in self._children or rel_dir in self._dirs()

    def under(self, rel_dir: str) -> Iterator[tuple[str, FileInfo]]:
        """Every file below ``rel_dir`` (recursively), directory by directory: one test per directory, not
        per file of the whole listing."""
        rel_dir = rel_dir.strip("/")
        if not rel_dir:
            yield from self.files.items()
            return
        prefix = rel_dir + "/"
        for parent, names in self._children.items():
            if parent == rel_dir or parent.startswith(prefix):
                for name, f in names.items():
                    yield f"{parent}/{name}", f

    def __len__(self) -> int:
        return len(self.files)

    def only_unfinished_writes(self) -> bool:
        """Whether no file is listed but, in the root itself, the leftovers of writes that never finished (or
        none at all): what a query stopped while Spark wrote its first ``metadata`` leaves (its
        ``.metadata.<uuid>.tmp`` and that file's ``.crc``). Spark never reads a temp file, and starts a query at
        such a location afresh. (Not a temp file in a subdirectory: Spark refuses to start a new query while
        ``offsets/``, ``commits/`` or ``state/`` holds anything, STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY.)"""
        return all("/" not in rel and is_unfinished_write(rel) for rel in self.files)

    def blocks_new_query(self) -> list[str]:
        """Where Spark would start a new query (no batch file in ``offsets/``): every entry directly under
        ``offsets/``, ``commits/`` and ``state/`` that makes it refuse to, or stop at its first write (empty: none).
        Spark 4.1+ requires the three to be empty or absent (``spark.sql.streaming.
        verifyCheckpointDirectoryEmptyOnStart``, default true: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): a temp
        file such as ``offsets/.0.<uuid>.tmp`` (a query stopped while Spark wrote its first offsets file leaves
        one) or an empty directory such as ``state/0`` stops it. Not counted: a temp file's Hadoop ``.crc`` (a
        checksum file system hides it from Spark's listing, and Spark never writes that name again) and a
        directory's own marker on an object store (S3A leaves it out of the listing); any other ``.crc``
        (``offsets/.0.crc``) is counted, as Spark's first write of that file fails on it. Nothing is counted
        while one of the three cannot be listed (that is said as such), or where the walk reports no empty
        directory (``empty_dirs``: local, or an object store's marker)."""
        if any(rel == d or rel.startswith(d + "/") for rel in self.unreadable_dirs for d in NEW_QUERY_EMPTY_DIRS):
            return []
        if any(listed_batch_id(name) is not None for name in self.files_in("offsets")):
            return []
        found = []
        for rel_dir in NEW_QUERY_EMPTY_DIRS:
            names = {name for name in self.files_in(rel_dir)
                     if name and not (is_hadoop_crc_name(name) and is_hidden_temp(hadoop_crc_target(name)))}
            names.update(self.subdirs(rel_dir))
            # an empty directory deeper down (``state/0/1``) is ``state/0`` here (the model's ``subdirs`` sees
            # only its parent, so that a store directory with no file is no store)
            prefix = rel_dir + "/"
            names.update(rel[len(prefix):].partition("/")[0] for rel in self.empty_dirs if rel.startswith(prefix))
            names.discard("")
            found += [f"{rel_dir}/{name}" for name in sorted(names)]
        return found


# what else a batch 0 that never committed leaves behind, and Spark trips over once its state is gone
BATCH_0_SINK_FIX = ("a file sink whose log holds batch 0 (`OUTPUT/_spark_metadata/0`), delete that file, its "
                    "`.0.crc` and the data files it names (`checkpoint-ops sink files OUTPUT --batch 0` lists them): "
                    "Spark skips a batch its sink log holds, so it would never write batch 0's state again and "
                    "fail at batch 1 (CANNOT_READ_DELTA_FILE_NOT_EXISTS)")


def new_query_blocked(listing: Listing, found: list[str]) -> tuple[str, str]:
    """The problem and the fix where ``Listing.blocks_new_query`` found ``found`` (not empty)."""
    refuses = ("offsets/ holds no batch file, so Spark starts this query as a new one, and it refuses to while "
               "offsets/, commits/ or state/ holds anything (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)")
    temps, empty, sidecars, other = [], [], [], []
    temp_dirs = False  # temp files in a subdirectory, which is left empty when they go
    for rel in found:
        # an object store's directory markers (``state/0/``) are no file
        below = [rel] if rel in listing.files else [r for r, _ in listing.under(rel) if not r.endswith("/")]
        if not below:
            empty.append(rel)
        elif all(is_unfinished_write(r.rpartition("/")[2]) for r in below):
            temps += below
            temp_dirs = temp_dirs or rel not in listing.files
        elif rel in listing.files and is_hadoop_crc_name(rel.rpartition("/")[2]):
            sidecars.append(rel)  # of a file that is not there (a temp file's is not counted)
        else:
            other.append(rel)
    if other and _only_batch_0_state(listing, found):
        return (f"{', '.join(other[:3])}{' and more' if len(other) > 3 else ''} "
                f"{'is' if len(other) == 1 else 'are'} there, but offsets/ holds no batch file and commits/ no "
                "commit, and state/ holds only what batch 0 writes (state version 1): batch 0 never committed (its "
                "offsets file is gone, e.g. deleted as a torn write); Spark starts this query as a new one, and "
                "refuses to while state/ holds anything (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)",
                f"while no query runs there, delete state/ at {listing.url('')} (it holds only batch 0's uncommitted "
                f"state) and, for {BATCH_0_SINK_FIX}; Spark then runs the query from its first batch afresh (if "
                "batches did commit here and their offsets and commits logs were lost, restore the checkpoint from a "
                "backup instead)")
    if other:  # files Spark wrote, without the offsets log that says what they belong to
        return (f"{', '.join(other[:3])}{' and more' if len(other) > 3 else ''} "
                f"{'is' if len(other) == 1 else 'are'} there, but offsets/ holds no batch file: Spark cannot restart "
                "this checkpoint, and refuses to start it as a new query (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY, "
                "or an assertion failure where commits/ holds a commit): a checkpoint that lost its offsets log?",
                "restore the checkpoint from a backup (checkpoint-ops backup list, then backup restore)")
    what = []
    if temps:
        first = any(r.startswith("offsets/") for r in temps)
        what.append(f"{'the temp file of a write' if len(temps) == 1 else f'{len(temps)} temp files of writes'} "
                    f"that never finished ({', '.join(temps[:3])}{' ...' if len(temps) > 3 else ''}"
                    f"{'; a query stopped while Spark wrote its first offsets file leaves one' if first else ''})")
    if empty:
        what.append(f"{'a directory' if len(empty) == 1 else 'directories'} with no file below "
                    f"({', '.join(empty[:3])}{' ...' if len(empty) > 3 else ''})")
    todo = [*(["delete the temp files (with any .crc sidecar of theirs)"] if temps else []),
            *([f"{'then ' if temps else ''}remove the directories under offsets/, commits/ and state/ left with "
               "no file below them"] if empty or temp_dirs else [])]
    why = f"; {refuses}" if what else ""
    if sidecars:  # Spark starts (a checksum file system hides them), then its write of that file fails on one
        what.append(f"{'a checksum sidecar' if len(sidecars) == 1 else 'checksum sidecars'} of no file "
                    f"({', '.join(sidecars[:3])}{' ...' if len(sidecars) > 3 else ''}): Spark's write of that file "
                    "fails on it (it reports 'Multiple streaming queries are concurrently using' the log)")
        todo.append("delete the sidecars")
    return (f"{' and '.join(what)}{why}",
            f"{' and '.join(todo)} at {listing.url('')}, while no query runs there: Spark never reads a temp file, "
            "an empty directory or a sidecar of no file, and it then starts the query afresh")


def _only_batch_0_state(listing: Listing, found: list[str]) -> bool:
    """Whether ``found`` (what blocks a new query) is all under ``state/``, commits/ holds no file, and every
    versioned state file (a delta, snapshot, changelog or zip, with or without a unique id) is of version 1 or
    below: what batch 0 writes before its commit, so nothing any committed batch relies on."""
    from .state import HDFS_CF_FILE, STATE_FILE

    if not all(rel.startswith("state/") for rel in found) or any(True for _ in listing.under("commits")):
        return False
    versioned = False
    for rel, _ in listing.under("state"):
        name = rel.rpartition("/")[2]
        if is_hadoop_crc_name(name):
            name = hadoop_crc_target(name)
        m = STATE_FILE.match(name) or HDFS_CF_FILE.match(name)
        if m:
            versioned = True
            if int(m.group(1)) > 1:
                return False
    return versioned


def require_no_dir_links(listing: Listing, what: str) -> None:
    """Refuse (BadInputError naming the first link and its target) a tree holding a symbolic link to a
    directory: ``what`` is the tree ("checkpoint", "sink output"). Spark follows such a link; this tool
    does not (``walk``), so it would judge, move, fence and back up the tree without the files there."""
    if not listing.dir_links:
        return
    rel, target = min(listing.dir_links.items())
    others = len(listing.dir_links) - 1
    more = f" (and {others} more: {', '.join(sorted(listing.dir_links)[1:4])}{', ...' if others > 3 else ''})" \
        if others else ""
    raise BadInputError(
        f"a symbolic link to {target}{more}; checkpoint-ops does not operate through symbolic links "
        f"to directories inside a {what}, so it would not see the files there (nothing was changed)",
        path=listing.url(rel),
        fix=f"while the query is stopped, put the directory itself in place of the link (move {target} back to "
        f"{listing.url(rel)}), or link the whole {what} instead (its root may be a symbolic link) and point the "
        "query and this command at it",
    )
