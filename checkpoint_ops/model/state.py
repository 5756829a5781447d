"""``state/``: operators, partitions, stores, their versioned files, and which versions load.

Batch ``b`` loads state version ``b`` and commits version ``b + 1``. Whether a version can be
loaded depends on the provider (reference §5):

* HDFS: the latest ``<s>.snapshot`` with ``s <= v`` (or empty at 0), then every ``.delta`` up to v.
* RocksDB: ``<v>.zip``; with changelog checkpointing the latest zip ``<= v`` plus changelogs.
* RocksDB, checkpoint format V2: files are ``<v>_<uniqueId>.*``; the id of version ``N + 1`` is in
  ``commits/N``; the changelog's lineage names the ids of the versions below it.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from ..storage.checksums import is_hadoop_crc_name
from .codecs import CodecError, changelog_header, decompress_prefix
from .listing import Listing, is_hidden_temp, listed_batch_id, spark_batch_id
from .state_schema import SCHEMA_FILE

STATE_FILE = re.compile(r"^(\d+)(?:_([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}))?\.(delta|snapshot|zip|changelog)$")
# Spark master after 4.3: column-family variants of the HDFS provider.
HDFS_CF_FILE = re.compile(r"^(\d+)\.([^./]+)\.(delta|snapshot)$")
HDFS_CF_METADATA = re.compile(r"^(\d+)\.metadata$")
SCHEMA_V3_FILE = re.compile(r"^(\d+)_([0-9a-fA-F-]{36})$")

STORE_SUBDIRS = {"_metadata", "SSTs", "logs"}

_PLAIN_KINDS = {"delta", "snapshot", "zip", "changelog"}
DEFAULT_STORE = "default"
SNAPSHOT_KINDS = {"snapshot", "zip"}
_LINEAGE_PREFIX_BYTES = 128 * 1024


def misnamed_state_entry(rel: str, right: str, stray: str | None) -> tuple[str, str]:
    """The problem and the fix for ``rel`` under ``state/``, a name Spark parses but reads from ``right``; ``stray``:
    why Spark never reaches it (``Checkpoint.misnamed_state``), or None."""
    problem = f"{rel} is not a name Spark reads: Spark parses its name as {right.rpartition('/')[2]} but reads {right}"
    if stray is not None:
        return (problem + f"; {stray}: a stray Spark never reads",
                f"move {rel} out of the checkpoint (keep a copy), then run `checkpoint-ops fsck` again")
    return (problem + ", which is missing: the query fails where Spark reads it (CANNOT_LOAD_STATE_STORE, or a "
            "file that does not exist)"), (f"if it is that file (or directory), rename it to {right}, its `.crc` "
                                           "sidecars with it; otherwise move it out of the checkpoint, keeping a "
                                           "copy. Then run `checkpoint-ops fsck` again")


def _number(text: str) -> int | None:
    """A non-negative number as Spark writes it in a state path (``32``; not ``032``, ``+32`` or "٣٢", which Spark
    parses as 32 when it lists a directory but never reads: it reads version 32 from ``32.delta``), or None."""
    value = spark_batch_id(text)
    return value if value is not None and value >= 0 and str(value) == text else None


HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass
class StateFile:
    rel: str
    version: int
    kind: str  # delta | snapshot | zip | changelog | metadata
    unique_id: str | None = None
    info: object = None  # the listing's FileInfo (size read only when asked)
    sidecars: list[str] = field(default_factory=list)  # rels of .crc files that travel with it

    @property
    def size(self) -> int:
        return self.info.size if self.info is not None else 0

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]


@dataclass
class Store:
    op_id: int
    partition: int
    name: str
    rel_dir: str
    files: list[StateFile] = field(default_factory=list)
    ssts: dict[str, str] = field(default_factory=dict)  # dfs file name -> rel (SSTs/ and logs/)
    temp_files: list[str] = field(default_factory=list)
    orphan_sidecars: list[str] = field(default_factory=list)  # checksum files whose main file is gone

    def __post_init__(self) -> None:
        self._index: dict[tuple[int, str | None, str], StateFile] | None = None

    def index(self) -> dict[tuple[int, str | None, str], StateFile]:
        if self._index is None:
            self._index = {(f.version, f.unique_id, f.kind): f for f in self.files}
        return self._index

    def file(self, version: int, kind: str, unique_id: str | None = None) -> StateFile | None:
        return self.index().get((version, unique_id, kind))

    @property
    def versions(self) -> list[int]:
        return sorted({f.version for f in self.files})

    @property
    def has_changelog(self) -> bool:
        return any(f.kind == "changelog" for f in self.files)

    @property
    def label(self) -> str:
        s = f"operator {self.op_id} partition {self.partition}"
        return s if self.name == DEFAULT_STORE else f"{s} store {self.name}"


@dataclass
class Operator:
    op_id: int
    rel_dir: str
    metadata_v1: dict | None = None
    metadata_v1_rel: str | None = None
    metadata_v2: dict[int, str] = field(default_factory=dict)  # batch id -> rel
    schema_files: list[tuple[str, int, str]] = field(default_factory=list)  # (store, batch id, rel): v3
    legacy_schema_files: dict[str, str] = field(default_factory=dict)  # store -> rel of its v1/v2 schema file
    stores: dict[tuple[int, str], Store] = field(default_factory=dict)
    metadata_v2_doc: dict | None = None

    @property
    def name(self) -> str | None:
        for md in (self.metadata_v1, self.metadata_v2_doc):
            if md:
                name = (md.get("operatorInfo") or {}).get("operatorName")
                if name:
                    return name
        return None

    @property
    def partitions(self) -> list[int]:
        return sorted({p for p, _ in self.stores})

    @property
    def store_names(self) -> list[str]:
        """Store names in the order Spark lists them (commit unique ids follow this order)."""
        declared = [s.get("storeName") for s in (self.metadata_v1 or {}).get("stateStoreInfo", [])]
        present = {n for _, n in self.stores}
        ordered = [n for n in declared if n in present]
        return ordered + sorted(present - set(ordered))

    def store_index(self, name: str) -> int:
        return self.store_names.index(name)

    @property
    def declared(self) -> tuple[list[str], int | None, str | None]:
        """What the operator metadata declares: (store names in Spark's order, partitions, the file's rel);
        ([], None, None) when no metadata was read (``StateModel.operator_metadata``)."""
        for doc, rel in ((self.metadata_v1, self.metadata_v1_rel),
                         (self.metadata_v2_doc, self.metadata_v2[max(self.metadata_v2)] if self.metadata_v2 else None)):
            infos = [i for i in (doc or {}).get("stateStoreInfo", []) if isinstance(i, dict) and i.get("storeName")]
            counts = [i.get("numPartitions") for i in infos if isinstance(i.get("numPartitions"), int)]
            if infos and counts:
                return [str(i["storeName"]) for i in infos], max(counts), rel
        return [], None, None


@dataclass(frozen=True)
class MissingStore:
    """A state store Spark loads at a restart and whose directory is not there: ``name`` None for a partition's
    whole directory (every store of it), ``partition`` None too for a whole operator. ``evidence``: what says
    it should be there."""

    op_id: int
    partition: int | None
    name: str | None
    rel_dir: str
    evidence: str

    @property
    def label(self) -> str:
        if self.partition is None:
            return f"operator {self.op_id}"
        return f"operator {self.op_id} partition {self.partition}" + (
            f" store {self.name}" if self.name not in (None, DEFAULT_STORE) else "")


@dataclass
class Build:
    """Whether one store version can be loaded, and which files that takes."""

    ok: bool
    files: list[StateFile] = field(default_factory=list)
    reason: str | None = None
    base_version: int | None = None
    missing: str | None = None  # rel of the file whose absence (or damage) stops the load
    missing_version: int | None = None  # its state version (SSTs: the zip's)


IdsForVersion = Callable[[int], "str | None"]


class StateModel:
    def __init__(self, listing: Listing, provider_class: str | None = None, codec: str = "lz4"):
        self.listing = listing
        self.codec = codec
        self.operators: dict[int, Operator] = {}
        self.other_files: list[str] = []  # anything under state/ we do not recognise
        # (rel, what Spark reads instead): a name Spark parses as an operator, partition or version but reads
        # from another (``state/00``, ``state/0/01``, ``state/0/0/032.delta``: ``_number``)
        self.misnamed: list[tuple[str, str]] = []
        self._lineage_cache: dict[str, list[tuple[int, str]] | None] = {}
        self._zip_cache: dict[str, dict] = {}
        self._blobs: dict[str, bytes | None] = {}  # contents a caller already read (see preload)
        self._metadata_read = False
        self._scan()
        self.provider = self._provider(provider_class)

    # -- scanning ------------------------------------------------------------------------------
    def _scan(self) -> None:
        L = self.listing
        for op_name in L.subdirs("state"):
            if _number(op_name) is None:  # not an operator Spark reads (``state/00``: it reads operator 0 at state/0)
                self._misnamed(f"state/{op_name}")
                continue
            op = Operator(int(op_name), f"state/{op_name}")
            self.operators[op.op_id] = op
            md = f"{op.rel_dir}/_metadata/metadata"
            if md in L:
                op.metadata_v1_rel = md
            for name in L.files_in(f"{op.rel_dir}/_metadata/v2"):
                if _number(name) is not None:
                    op.metadata_v2[int(name)] = f"{op.rel_dir}/_metadata/v2/{name}"
                else:
                    self._misnamed(f"{op.rel_dir}/_metadata/v2/{name}")
            for store in L.subdirs(f"{op.rel_dir}/_stateSchema"):
                for name in L.files_in(f"{op.rel_dir}/_stateSchema/{store}"):
                    m = SCHEMA_V3_FILE.match(name)
                    if m:
                        op.schema_files.append((store, int(m.group(1)), f"{op.rel_dir}/_stateSchema/{store}/{name}"))
            for part_name in L.subdirs(op.rel_dir):
                if _number(part_name) is None:
                    self._misnamed(f"{op.rel_dir}/{part_name}")
                    continue
                part = int(part_name)
                pdir = f"{op.rel_dir}/{part_name}"
                named = [d for d in L.subdirs(pdir) if d not in STORE_SUBDIRS]
                if L.files_in(pdir) or any(d in STORE_SUBDIRS for d in L.subdirs(pdir)) or not named:
                    op.stores[(part, DEFAULT_STORE)] = self._scan_store(op.op_id, part, DEFAULT_STORE, pdir)
                for store_name in named:
                    op.stores[(part, store_name)] = self._scan_store(op.op_id, part, store_name, f"{pdir}/{store_name}")
                if part == 0:  # Spark writes v1/v2 schema files in partition 0 only
                    for store_name, sdir in [(DEFAULT_STORE, pdir)] + [(n, f"{pdir}/{n}") for n in named]:
                        if SCHEMA_FILE in L.files_in(f"{sdir}/_metadata"):
                            op.legacy_schema_files[store_name] = f"{sdir}/_metadata/{SCHEMA_FILE}"

    def _misnamed(self, rel: str, number: str | None = None) -> None:
        """Note ``rel`` when ``number`` (its name's numeric part; the whole name for a directory) is one Spark
        parses, a leading ``+`` included, but not as Spark writes it."""
        head, _, name = rel.rpartition("/")
        number = name if number is None else number.split("_", 1)[0]
        value = listed_batch_id(number)
        if value is not None and value >= 0 and str(value) != number:
            self.misnamed.append((rel, f"{head}/{str(value) + name[len(number):]}"))

    def _scan_store(self, op_id: int, part: int, name: str, rel_dir: str) -> Store:
        L = self.listing
        store = Store(op_id, part, name, rel_dir)
        by_name: dict[str, StateFile] = {}
        sidecar_names: list[str] = []
        for fname, info in L.files_in(rel_dir).items():
            rel = f"{rel_dir}/{fname}"
            if fname[0] != ".":  # hidden names are sidecars or temp files: skip the regexes
                stem, _, ext = fname.partition(".")
                if ext in _PLAIN_KINDS and _number(stem) is not None:  # "<v>.delta" etc.: no regex
                    by_name[fname] = StateFile(rel, int(stem), ext, None, info)
                    continue
                m = STATE_FILE.match(fname)
                if m and _number(m.group(1)) is not None:
                    by_name[fname] = StateFile(rel, int(m.group(1)), m.group(3), m.group(2), info)
                    continue
                m = HDFS_CF_FILE.match(fname) or HDFS_CF_METADATA.match(fname)
                if m and _number(m.group(1)) is not None:
                    kind = m.group(3) if m.re is HDFS_CF_FILE else "metadata"
                    by_name[fname] = StateFile(rel, int(m.group(1)), kind, None, info)
                    continue
                if fname.rpartition(".")[2] in _PLAIN_KINDS:
                    self._misnamed(rel, stem)
            if is_hidden_temp(fname):
                store.temp_files.append(rel)
            elif fname.endswith(".crc"):
                sidecar_names.append(fname)
            else:
                self.other_files.append(rel)
        for fname in sidecar_names:
            main = _sidecar_main(fname)
            target = by_name.get(main)
            if target is not None:
                target.sidecars.append(f"{rel_dir}/{fname}")
            elif main in L.files_in(rel_dir):
                pass  # sidecar of a non-state file (e.g. a temp file): left to fsck's generic check
            else:
                store.orphan_sidecars.append(f"{rel_dir}/{fname}")
        store.files = sorted(by_name.values(), key=lambda f: (f.version, f.kind, f.unique_id or ""))
        for sub in ("SSTs", "logs"):
            for fname in L.files_in(f"{rel_dir}/{sub}"):
                if fname.endswith((".sst", ".log")) and not fname.startswith("."):
                    store.ssts[fname] = f"{rel_dir}/{sub}/{fname}"
        return store

    def _provider(self, provider_class: str | None) -> str | None:
        if provider_class:
            if provider_class.endswith("RocksDBStateStoreProvider"):
                return "rocksdb"
            if provider_class.endswith("HDFSBackedStateStoreProvider"):
                return "hdfs"
            return provider_class
        kinds = {f.kind for s in self.stores() for f in s.files}
        if kinds & {"zip", "changelog"}:
            return "rocksdb"
        if kinds & {"delta", "snapshot"}:
            return "hdfs"
        return None

    # -- views -------------------------------------------------------------------------------
    def stores(self) -> list[Store]:
        return [s for op in self.operators.values() for s in op.stores.values()]

    @cached_property
    def store_dirs(self) -> frozenset[str]:
        """The stores' own folders, whose orphan sidecars the scan finds (``Store.orphan_sidecars``); not
        their ``SSTs/``, ``logs/`` or ``_metadata/``, nor the operators' metadata and schema folders."""
        return frozenset(store.rel_dir for store in self.stores())

    @property
    def has_unique_ids(self) -> bool:
        return any(f.unique_id for s in self.stores() for f in s.files)

    def version_range(self, op: Operator) -> tuple[int | None, int | None]:
        vs = [v for s in op.stores.values() for v in s.versions]
        return (min(vs), max(vs)) if vs else (None, None)

    def operator_metadata(self) -> None:
        """Read operator metadata files (small; one read per operator), once."""
        if self._metadata_read:
            return
        self._metadata_read = True
        fm, L = self.listing.fm, self.listing
        paths = {}
        for op in self.operators.values():
            if op.metadata_v1_rel:
                paths[L.abs(op.metadata_v1_rel)] = (op, 1)
            if op.metadata_v2:
                paths[L.abs(op.metadata_v2[max(op.metadata_v2)])] = (op, 2)
        for path, data in fm.read_many(paths, errors={}).items():  # unreadable: no name shown, fsck says why
            op, v = paths[path]
            doc = _parse_versioned_json(data)
            if v == 1:
                op.metadata_v1 = doc
            else:
                op.metadata_v2_doc = doc

    def missing_stores(self, shuffle_partitions: int | None = None, committed_ops=(),
                       keyed: Callable[[Operator], bool | None] = lambda op: None) -> list[MissingStore]:
        """The stores a restart loads that have no directory, and every operator below the highest id present or
        named in a commit (``committed_ops``: checkpoint format V2 lists each operator's state ids): Spark numbers
        stateful operators from 0.

        Partitions: a keyed operator (a grouping key, join keys, a dedup key) writes every partition of every
        store at every version, empty or not, so each one missing fails the load (CANNOT_LOAD_STATE_STORE).
        One without a key (a global aggregation, a streaming limit) keeps all its state in partition 0 although
        its metadata declares as many partitions as the others. So every partition the operator metadata
        declares (``Operator.declared``; without it, ``shuffle_partitions``, the value the offsets log pins) is
        expected only where the operator is known to be keyed: it has state beyond partition 0, or ``keyed(op)``
        (its key schema) says so; otherwise partition 0 alone. Store names: the metadata's, else those present.
        Reads the operator metadata (``operator_metadata``). Not seen: the last operator's whole directory
        deleted with no commit naming it, and every partition but 0 of a keyed operator whose key schema cannot
        be read."""
        self.operator_metadata()
        out: list[MissingStore] = []
        ids = set(self.operators) | {int(i) for i in committed_ops}
        for op_id in range(max(ids) + 1 if ids else 0):
            if op_id not in self.operators:
                why = (f"a commit lists state ids for operator {op_id}" if op_id in {int(i) for i in committed_ops}
                       else f"operators up to {max(ids)} have state, and Spark numbers them from 0")
                out.append(MissingStore(op_id, None, None, f"state/{op_id}", why))
        for op in sorted(self.operators.values(), key=lambda o: o.op_id):
            names, parts, rel = op.declared
            if rel is not None:
                evidence = f"{rel} declares {parts} partitions of store(s) {', '.join(names)}"
            else:
                names = sorted({n for _, n in op.stores}) or [DEFAULT_STORE]
                parts = shuffle_partitions or (max(op.partitions) + 1 if op.partitions else 0)
                evidence = (f"the offsets log pins spark.sql.shuffle.partitions={parts}" if shuffle_partitions
                            else f"partition {max(op.partitions)} has state")
            if any(p > 0 for p in op.partitions):
                evidence += ", and partitions besides 0 have state"
            elif keyed(op):
                evidence += ", and its state has a key (every partition holds state)"
            else:  # no key, or none known: all of its state may be in partition 0
                parts = 1
                evidence = ("an operator without a key keeps its state in partition 0" if keyed(op) is False
                            else "every stateful operator keeps state in partition 0")
            for part in range(parts):
                gone = [name for name in names if (part, name) not in op.stores]
                if len(gone) > 1 and len(gone) == len(names):  # the partition's whole directory
                    out.append(MissingStore(op.op_id, part, None, f"{op.rel_dir}/{part}", evidence))
                    continue
                for name in gone:
                    where = f"{op.rel_dir}/{part}" + ("" if name == DEFAULT_STORE else f"/{name}")
                    out.append(MissingStore(op.op_id, part, name, where, evidence))
        return out

    # -- loading rules -----------------------------------------------------------------------
    def check(self, store: Store, version: int, unique_id: str | None = None,
              ids_for: IdsForVersion | None = None, exact: bool = False) -> Build:
        """Can ``version`` of ``store`` be loaded? ``unique_id`` is needed on checkpoint format V2.

        ``ids_for(v)`` gives the unique id of version v from the commit log (None if unknown).
        ``exact=True`` follows Spark to the letter (reads the changelog lineage and zip SST lists);
        the default uses only the listing and commit ids.
        """
        if version <= 0:
            return Build(True, [], base_version=0)
        if unique_id is not None:
            return self._check_v2(store, version, unique_id, ids_for, exact)
        if self.provider == "hdfs" or (self.provider is None and any(f.kind in ("delta", "snapshot") for f in store.files)):
            return self._check_chain(store, version, "snapshot", "delta", exact)
        if store.has_changelog:
            return self._check_chain(store, version, "zip", "changelog", exact)
        z = store.file(version, "zip")
        if z is None:
            return Build(False, reason=f"{store.label}: version {version} needs {version}.zip, which is missing",
                         missing=f"{store.rel_dir}/{version}.zip", missing_version=version)
        return self._with_ssts(store, Build(True, [z], base_version=version), exact)

    def _check_chain(self, store: Store, version: int, snap_kind: str, delta_kind: str, exact: bool) -> Build:
        snaps = [f.version for f in store.files if f.kind == snap_kind and f.version <= version and f.unique_id is None]
        base = max(snaps) if snaps else 0
        chain = [store.file(base, snap_kind)] if base else []
        for v in range(base + 1, version + 1):
            f = store.file(v, delta_kind)
            if f is None:
                where = f"{base}.{snap_kind}" if base else "empty state"
                return Build(False, reason=f"{store.label}: version {version} loads from {where} but "
                                            f"{v}.{delta_kind} is missing", base_version=base,
                             missing=f"{store.rel_dir}/{v}.{delta_kind}", missing_version=v)
            chain.append(f)
        return self._with_ssts(store, Build(True, chain, base_version=base), exact)

    def _check_v2(self, store: Store, version: int, uid: str, ids_for: IdsForVersion | None, exact: bool) -> Build:
        if exact:
            return self._check_v2_lineage(store, version, uid)
        chain: list[StateFile] = []
        k, u = version, uid
        lineage: dict[int, str] = {}
        while True:
            if k == 0:
                return Build(True, chain, base_version=0)
            z = store.file(k, "zip", u)
            if z is not None:
                chain.append(z)
                return Build(True, chain, base_version=k)
            c = store.file(k, "changelog", u)
            if c is None:
                return Build(False, reason=f"{store.label}: version {k} (id {u}) has neither {k}_{u}.zip nor "
                                            f"{k}_{u}.changelog", missing=f"{store.rel_dir}/{k}_{u}.changelog",
                             missing_version=k)
            chain.append(c)
            nxt = (ids_for(k - 1) if ids_for else None) or lineage.get(k - 1)
            if nxt is None and k - 1 > 0:
                items = self.lineage(c)
                if items is None:
                    return Build(False, reason=f"{store.label}: cannot read the lineage of {c.name}",
                                 missing=c.rel, missing_version=k)
                lineage.update(dict(items))
                nxt = lineage.get(k - 1)
                if nxt is None:
                    return Build(False, reason=f"{store.label}: lineage of {c.name} does not reach version "
                                                f"{k - 1} and no snapshot was found", missing=c.rel,
                                 missing_version=k - 1)
            k, u = k - 1, nxt

    def _check_v2_lineage(self, store: Store, version: int, uid: str) -> Build:
        """Spark's RocksDB.load for format V2 (reference §5.4)."""
        z = store.file(version, "zip", uid)
        if z is not None:
            return self._with_ssts(store, Build(True, [z], base_version=version), True)
        c = store.file(version, "changelog", uid)
        if c is None:
            return Build(False, reason=f"{store.label}: neither {version}_{uid}.zip nor {version}_{uid}.changelog exists",
                         missing=f"{store.rel_dir}/{version}_{uid}.changelog", missing_version=version)
        items = self.lineage(c)
        if items is None:
            return Build(False, reason=f"{store.label}: cannot read the lineage of {c.name}", missing=c.rel,
                         missing_version=version)
        lineage = sorted(items + [(version, uid)])
        # Spark loads from the newest zip of the lineage and replays the changelogs above it. Walking down
        # from the top names the nearest version that has neither (the hole a user or a bad copy made),
        # whatever snapshots Spark's maintenance happened to have uploaded below it.
        base_v, chain = None, []  # changelogs from the top down, then the zip they replay onto
        for v, u in reversed(lineage):
            z = store.file(v, "zip", u)
            if z is not None:
                base_v = v
                chain.append(z)
                break
            f = store.file(v, "changelog", u)
            if f is None:
                return Build(False, reason=f"{store.label}: lineage of {c.name} needs {v}_{u}.changelog, which is missing",
                             missing=f"{store.rel_dir}/{v}_{u}.changelog", missing_version=v)
            chain.append(f)
        if base_v is None:
            if lineage[0][0] != 1:
                first_v, first_u = lineage[0]
                return Build(False, reason=f"{store.label}: no snapshot of the lineage of {c.name} "
                                            f"({lineage[0][0]}..{version}) exists",
                             missing=f"{store.rel_dir}/{first_v - 1}_<id>.zip", missing_version=first_v - 1)
            base_v = 0
        chain.reverse()
        return self._with_ssts(store, Build(True, chain, base_version=base_v), True)

    def _with_ssts(self, store: Store, build: Build, exact: bool) -> Build:
        if not exact:
            return build
        for f in build.files:
            if f.kind != "zip":
                continue
            try:
                names = self.zip_ssts(f)
            except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError) as e:
                return Build(False, build.files, f"{store.label}: {f.name} is not a readable RocksDB checkpoint zip "
                                                 f"({e})", build.base_version, missing=f.rel, missing_version=f.version)
            missing = [n for n in names if n not in store.ssts]
            if missing:
                sub = "logs" if missing[0].endswith(".log") else "SSTs"
                return Build(False, build.files, f"{store.label}: {f.name} references missing "
                                                 f"{sub}/{missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""),
                             build.base_version, missing=f"{store.rel_dir}/{sub}/{missing[0]}",
                             missing_version=f.version)
        return build

    # -- file contents ---------------------------------------------------------------------------
    def preload(self, blobs: dict[str, bytes | None] | None) -> None:
        """Let the next checks use these contents (rel -> bytes) instead of reading again; None clears."""
        self._blobs = dict(blobs or {})

    def lineage(self, f: StateFile) -> list[tuple[int, str]] | None:
        if f.rel not in self._lineage_cache:
            try:
                blob = self._blobs.get(f.rel)
                head = blob[:_LINEAGE_PREFIX_BYTES] if blob is not None else \
                    self.listing.fm.read_prefix(self.listing.abs(f.rel), _LINEAGE_PREFIX_BYTES)
                _, items = changelog_header(decompress_prefix(head, self.codec))
                self._lineage_cache[f.rel] = items or []
            except (CodecError, ValueError, OSError):
                self._lineage_cache[f.rel] = None
        return self._lineage_cache[f.rel]

    def zip_metadata(self, f: StateFile) -> dict:
        """The ``metadata`` entry of a RocksDB checkpoint zip (its SST list)."""
        if f.rel not in self._zip_cache:
            data = self._blobs.get(f.rel)
            if data is None:
                data = self.listing.fm.read_bytes(self.listing.abs(f.rel))
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                self._zip_cache[f.rel] = _parse_versioned_json(z.read("metadata"))
        return self._zip_cache[f.rel]

    def zip_ssts(self, f: StateFile) -> list[str]:
        """The SST and log files the zip names; ValueError when its ``metadata`` entry is not RocksDB's."""
        md = self.zip_metadata(f)
        if not md:
            raise ValueError("its metadata entry is not the JSON RocksDB writes")
        names: list[str] = []
        for key, name_key in (("sstFiles", "dfsSstFileName"), ("logFiles", "dfsLogFileName")):
            entries = md.get(key, [])
            if not isinstance(entries, list) or not all(
                    isinstance(e, dict) and isinstance(e.get(name_key), str) for e in entries):
                raise ValueError(f"its metadata's {key} is not a list of files with a {name_key}")
            names += [e[name_key] for e in entries]
        return names


def _sidecar_main(name: str) -> str:
    """The file a checksum sidecar belongs to: ``.x.crc`` -> x, ``x.crc`` -> x, ``.x.crc.crc`` -> x."""
    if is_hadoop_crc_name(name):
        name = name[1:-4]
    if name.endswith(".crc"):
        name = name[:-4]
    return name


def _parse_versioned_json(data: bytes | None) -> dict:
    if not data:
        return {}
    text = data.decode("utf-8", "replace")
    head, _, body = text.partition("\n")
    try:
        doc = json.loads(body if head.startswith("v") else text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
