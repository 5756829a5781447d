"""The stateful operators of a checkpoint as a user sees them, and the operator files Spark reads to restart.

For each operator (``state/<op>``): its name (from the operator metadata), its stores and partitions,
the key and value schema of every store (and column family, for transformWithState), the schema files
and the batches each covers, and the state files and bytes. The state model gives the listing; the
operator metadata (``operator_metadata.py``) and state schema files (``state_schema.py``) are small and
read at most once each, all at once (concurrently on object stores). A file that is missing, cannot be
read or does not parse is a ``FileProblem`` in the result, never an exception.

What Spark 4.3 reads of them when it restarts after batch N (checked by damaging each and restarting):
the newest operator metadata v2 at or below N and the v3 schema files it names (transformWithState),
and the v1/v2 schema file of every store; a damaged one stops the restart. A *missing* v1/v2 schema
file or v1 operator metadata does not: Spark writes a new one (without checking compatibility against
what it lost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..storage.paths import hadoop_path_to_location, parse_url
from .logfile import LogFormatError, unreadable
from .operator_metadata import OperatorMetadata, parse_operator_metadata
from .state import Operator, StateModel
from .state_schema import ColumnFamilySchema, StateSchemaError, StateSchemaFile, parse_state_schema, simple_string

METADATA = "operator metadata"
SCHEMA = "state schema"
_SCHEMA_DIR = "_stateSchema"


@dataclass(frozen=True)
class OperatorFile:
    """An operator metadata or state schema file (it may be missing: a file something refers to)."""

    rel: str
    op_id: int
    role: str  # METADATA | SCHEMA
    store: str | None = None  # schema files: the store they describe
    batch: int | None = None  # v2 metadata and v3 schema files: the batch whose query run wrote them


@dataclass(frozen=True)
class FileProblem:
    """An operator file that is missing, unreadable or does not parse, or one a restart needs that Spark purged."""

    rel: str
    path: str
    role: str  # METADATA | SCHEMA
    kind: str  # missing | purged | empty | truncated | unknown-version | malformed | unreadable | no-version | not-json
    problem: str  # a sentence naming the file's role: "the state schema file is truncated: ..."

    def to_dict(self) -> dict:
        return {"path": self.path, "role": self.role, "kind": self.kind, "problem": self.problem}


@dataclass(frozen=True)
class Batches:
    first: int | None
    last: int | None

    def to_dict(self) -> dict:
        return {"first": self.first, "last": self.last}


@dataclass(frozen=True)
class SchemaFileInfo:
    """A schema file of a store and the batches it covers (v1/v2: every batch since the query started;
    v3: from the batch that wrote it to the one before the next)."""

    rel: str
    format_version: int | None  # None when it cannot be read
    batches: Batches
    problem: str | None = None

    def to_dict(self) -> dict:
        return {"path": self.rel, "format_version": self.format_version, "batches": self.batches.to_dict(),
                "problem": self.problem}


@dataclass(frozen=True)
class StoreInfo:
    """One state store of an operator, across its partitions."""

    name: str
    partitions: int
    versions: Batches
    files: int  # state files of every partition, with RocksDB's SST and log files (checksum sidecars aside)
    bytes: int  # their size: the state size of the store
    column_families: tuple[ColumnFamilySchema, ...]  # from the schema file in force; empty if none is readable
    schema_files: tuple[SchemaFileInfo, ...]

    def to_dict(self) -> dict:
        single = self.column_families[0] if len(self.column_families) == 1 else None
        return {
            "name": self.name,
            "partitions": self.partitions,
            "versions": self.versions.to_dict(),
            "files": self.files,
            "bytes": self.bytes,
            "key_schema": simple_string(single.key_schema) if single else None,
            "value_schema": simple_string(single.value_schema) if single else None,
            "column_families": [c.to_dict() for c in self.column_families],
            "schema_files": [f.to_dict() for f in self.schema_files],
        }


@dataclass(frozen=True)
class OperatorInfo:
    """What ``inspect`` shows of one operator beyond the listing: its metadata and its stores."""

    op_id: int
    name: str | None
    metadata: OperatorMetadata | None  # the one in force (newest v2, else v1); None if absent or unreadable
    stores: tuple[StoreInfo, ...]

    def to_dict(self) -> dict:
        md = self.metadata
        return {
            "metadata": None if md is None else {"path": md.rel, "format_version": md.format_version,
                                                 "batch": md.batch, "properties": md.properties},
            "state_stores": [s.to_dict() for s in self.stores],
        }


class OperatorFiles:
    """The operator metadata and state schema files of one checkpoint's ``state/``, each read and parsed
    at most once."""

    def __init__(self, state: StateModel):
        self.state = state
        self.listing = state.listing
        self._parsed: dict[str, OperatorMetadata | StateSchemaFile | FileProblem] = {}

    # -- which files there are --------------------------------------------------------------------------------
    def files(self, op: Operator) -> list[OperatorFile]:
        """Every operator metadata and schema file of ``op`` on disk."""
        out = []
        if op.metadata_v1_rel:
            out.append(OperatorFile(op.metadata_v1_rel, op.op_id, METADATA))
        out += [OperatorFile(rel, op.op_id, METADATA, batch=b) for b, rel in sorted(op.metadata_v2.items())]
        out += [OperatorFile(rel, op.op_id, SCHEMA, store) for store, rel in sorted(op.legacy_schema_files.items())]
        out += [OperatorFile(rel, op.op_id, SCHEMA, store, b) for store, b, rel in sorted(op.schema_files)]
        return out

    def restart_files(self, op: Operator, batch: int) -> list[OperatorFile | FileProblem]:
        """The operator files Spark reads to restart after ``batch`` (module docstring), or the problem
        that stops it reaching one. Reads the operator metadata v2 it picks."""
        out: list[OperatorFile | FileProblem] = []
        md_dir = f"{op.rel_dir}/_metadata/v2"
        if op.metadata_v2:
            eligible = [b for b in op.metadata_v2 if b <= batch]
            if not eligible:
                oldest = min(op.metadata_v2)
                out.append(FileProblem(f"{md_dir}/{batch}", self.listing.url(md_dir), METADATA, "purged",
                                       f"the operator metadata in force at batch {batch} was purged (the oldest "
                                       f"left is {md_dir}/{oldest}): Spark's restart after batch {batch} reads it"))
                return out + self._legacy_schemas(op)
            md_file = OperatorFile(op.metadata_v2[max(eligible)], op.op_id, METADATA, batch=max(eligible))
            out.append(md_file)
            md = self.read([md_file])[md_file.rel]
            if isinstance(md, OperatorMetadata):
                for store in md.stores:
                    for path in store.schema_paths:
                        rel = self.schema_rel(op, path)
                        if rel is None:
                            continue  # not a file of this checkpoint's layout: fsck warns about the path
                        out.append(OperatorFile(rel, op.op_id, SCHEMA, store.name, _schema_batch(rel)))
        elif op.schema_files:
            out.append(FileProblem(md_dir, self.listing.url(md_dir), METADATA, "missing",
                                   f"the operator metadata is missing: {op.rel_dir}/_stateSchema holds transformWith"
                                   f"State schema files but {md_dir}/ has no metadata file, and Spark fails to "
                                   "restart without it (STDS_FAILED_TO_READ_OPERATOR_METADATA)"))
        return out + self._legacy_schemas(op)

    def _legacy_schemas(self, op: Operator) -> list[OperatorFile]:
        return [OperatorFile(rel, op.op_id, SCHEMA, store) for store, rel in sorted(op.legacy_schema_files.items())]

    def schema_rel(self, op: Operator, path: str) -> str | None:
        """The checkpoint-relative file a schema path in operator metadata v2 names, by its layout
        (``.../state/<op>/_stateSchema/<store>/<file>``), wherever the checkpoint was when Spark wrote it."""
        marker = f"/state/{op.op_id}/{_SCHEMA_DIR}/"
        loc = hadoop_path_to_location(path)
        cut = ("/" + loc.path).rfind(marker)
        return None if cut < 0 else ("/" + loc.path)[cut + 1:]

    def outside_paths(self, md: OperatorMetadata) -> list[str]:
        """Schema paths in ``md`` that are not inside this checkpoint (it was copied or moved since)."""
        here = parse_url(self.listing.url(""))
        out = []
        for store in md.stores:
            for path in store.schema_paths:
                loc = hadoop_path_to_location(path)
                if loc.scheme != here.scheme or not loc.path.startswith(here.path.rstrip("/") + "/"):
                    out.append(path)
        return out

    # -- reading --------------------------------------------------------------------------------------------
    def read(self, files: Iterable[OperatorFile]) -> dict[str, OperatorMetadata | StateSchemaFile | FileProblem]:
        """Parse these files (those not parsed yet in one concurrent read); rel -> result."""
        files = list(files)
        L = self.listing
        todo = {f.rel: f for f in files if f.rel not in self._parsed}
        present = {L.abs(rel): f for rel, f in todo.items() if rel in L}
        for rel, f in todo.items():
            if rel not in L:
                self._parsed[rel] = FileProblem(rel, L.url(rel), f.role, "missing",
                                                f"the {f.role} file is missing: Spark's restart reads it")
        if present:
            failed: dict[str, OSError] = {}
            for path, data in L.fm.read_many(list(present), errors=failed).items():
                f = present[path]
                self._parsed[f.rel] = self._parse(f, data, failed.get(path))
        return {f.rel: self._parsed[f.rel] for f in files}

    def _parse(self, f: OperatorFile, data: bytes | None, error: OSError | None):
        url = self.listing.url(f.rel)
        if data is None:
            if error is not None:
                e = unreadable(url, error)
                return FileProblem(f.rel, url, f.role, "unreadable", f"the {f.role} file {e.problem}")
            return FileProblem(f.rel, url, f.role, "missing", f"the {f.role} file vanished while being read")
        try:
            if f.role == METADATA:
                return parse_operator_metadata(data, f.rel, url, f.batch)
            return parse_state_schema(data, f.rel, url, f.store or "default", f.batch)
        except StateSchemaError as e:
            return FileProblem(f.rel, url, f.role, e.kind, f"the state schema file {e.problem}")
        except LogFormatError as e:
            return FileProblem(f.rel, url, f.role, e.kind, f"the operator metadata file cannot be read: {e.problem}")

    def problems(self) -> list[FileProblem]:
        """Every problem found in the files read so far."""
        return [p for p in self._parsed.values() if isinstance(p, FileProblem)]

    # -- what inspect shows -------------------------------------------------------------------------------------
    def describe(self, op: Operator, last_batch: int | None) -> OperatorInfo:
        """``op`` as inspect shows it; ``last_batch`` (the newest planned) ends the newest schema file's range."""
        parsed = self.read(self.files(op))
        metadata = None
        for rel in ([op.metadata_v2[max(op.metadata_v2)]] if op.metadata_v2 else []) + (
                [op.metadata_v1_rel] if op.metadata_v1_rel else []):
            if isinstance(parsed.get(rel), OperatorMetadata):
                metadata = parsed[rel]
                break
        stores = []
        for name in op.store_names:
            parts = [s for (p, n), s in op.stores.items() if n == name]
            versions = [v for s in parts for v in s.versions]
            sizes = [f.size for s in parts for f in s.files]
            sizes += [self.listing.get(rel).size for s in parts for rel in s.ssts.values()]
            schemas, families = self._store_schemas(op, name, parsed, last_batch)
            stores.append(StoreInfo(name, len(parts), Batches(min(versions, default=None), max(versions, default=None)),
                                    len(sizes), sum(sizes), families, schemas))
        name = metadata.name if metadata is not None else op.name
        return OperatorInfo(op.op_id, name, metadata, tuple(stores))

    def _store_schemas(self, op: Operator, store: str, parsed: dict,
                       last_batch: int | None) -> tuple[tuple[SchemaFileInfo, ...], tuple[ColumnFamilySchema, ...]]:
        infos: list[SchemaFileInfo] = []
        families: tuple[ColumnFamilySchema, ...] = ()
        legacy = op.legacy_schema_files.get(store)
        if legacy is not None:
            got = parsed[legacy]
            if isinstance(got, StateSchemaFile):
                infos.append(SchemaFileInfo(legacy, got.format_version, Batches(0, last_batch)))
                families = got.column_families
            else:
                infos.append(SchemaFileInfo(legacy, None, Batches(0, last_batch), got.problem))
        v3 = sorted((b, rel) for s, b, rel in op.schema_files if s == store)
        for i, (b, rel) in enumerate(v3):
            end = v3[i + 1][0] - 1 if i + 1 < len(v3) else last_batch
            got = parsed[rel]
            if isinstance(got, StateSchemaFile):
                infos.append(SchemaFileInfo(rel, got.format_version, Batches(b, end)))
                families = got.column_families  # the newest readable one is in force
            else:
                infos.append(SchemaFileInfo(rel, None, Batches(b, end), got.problem))
        return tuple(infos), families


def _schema_batch(rel: str) -> int | None:
    head = rel.rsplit("/", 1)[-1].split("_", 1)[0]
    return int(head) if head.isdecimal() else None
