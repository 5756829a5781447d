"""State schema files: the key and value schema of every state store (and column family) as Spark wrote them.

Where they are:

* v1 and v2: ``state/<op>/0/[<store>/]_metadata/schema``, partition 0 only, one file for every batch of
  the query (written when the operator first ran; stream-stream joins have one per store);
* v3 (transformWithState): ``state/<op>/_stateSchema/<store>/<batch>_<uuid>``, one per query run that
  wrote operator metadata v2 at ``<batch>``; that metadata names the files Spark reads by absolute path.

Format (``SchemaHelper`` in Spark 4.3.0, checked against its bytecode and against files it wrote), all
big-endian Java ``DataOutputStream``; ``utf(s)`` is ``writeUTF`` (2-byte length, modified UTF-8) and
``chunked(s)`` is ``int n`` followed by ``n`` times ``utf(chunk)`` (chunks of at most 65,535 chars):

* every file: ``utf("v<n>")``; Spark reads v1 to v3;
* v1: ``utf(key schema JSON)``, ``utf(value schema JSON)``;
* v2: ``chunked(key schema JSON)``, ``chunked(value schema JSON)``;
* v3: ``int`` number of column families, then for each: ``utf(name)``, ``short`` key schema id,
  ``chunked(key schema JSON)``, ``short`` value schema id, ``chunked(value schema JSON)``,
  ``chunked(key encoder spec JSON)``, ``chunked(user key schema JSON)`` (``"{    }"`` when none).

Schemas are Spark's ``StructType.json``; ``simple_string`` renders them as Spark's ``simpleString``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from ..errors import BadInputError
from .codecs import CodecError, read_java_utf

SCHEMA_FILE = "schema"  # under <store dir>/_metadata/ (v1, v2)
MAX_SCHEMA_VERSION = 3  # SchemaHelper.SchemaReader in Spark 4.3 reads v1 to v3
DEFAULT_COLUMN_FAMILY = "default"
_NO_USER_KEY_SCHEMA = "{    }"
_MAX_COUNT = 1 << 20  # column families, or 64 KB chunks of one schema: more is not a schema file
_SIMPLE_NAMES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


class StateSchemaError(BadInputError):
    """A state schema file Spark cannot read. ``kind``: empty | truncated | unknown-version | malformed."""

    def __init__(self, problem: str, *, path: str, kind: str):
        self.kind = kind
        super().__init__(problem, path=path, fix="restore it from a backup, or roll back to a batch before the damage")


@dataclass(frozen=True)
class ColumnFamilySchema:
    """The schema of one column family of a store (v1 and v2 files hold one, named ``default``)."""

    name: str
    key_schema: dict  # Spark's StructType JSON
    value_schema: dict
    key_schema_id: int | None = None  # v3
    value_schema_id: int | None = None  # v3
    key_encoder: dict | None = None  # v3: the key state encoder spec (how RocksDB keys are encoded)
    user_key_schema: dict | None = None  # v3: the user key of a map state

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "key_schema": simple_string(self.key_schema),
            "value_schema": simple_string(self.value_schema),
            "key_schema_json": self.key_schema,
            "value_schema_json": self.value_schema,
            "key_schema_id": self.key_schema_id,
            "value_schema_id": self.value_schema_id,
            "key_encoder": self.key_encoder,
            "user_key_schema": simple_string(self.user_key_schema) if self.user_key_schema else None,
        }


@dataclass(frozen=True)
class StateSchemaFile:
    """One parsed state schema file."""

    rel: str
    store: str
    format_version: int
    column_families: tuple[ColumnFamilySchema, ...]
    batch: int | None = None  # v3: the batch whose query run wrote it; None for v1/v2 (every batch)

    def to_dict(self) -> dict:
        return {"path": self.rel, "store": self.store, "format_version": self.format_version, "batch": self.batch,
                "column_families": [c.to_dict() for c in self.column_families]}


class _Reader:
    """Reads the DataOutputStream primitives of a schema file, naming what it was reading on failure."""

    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def truncated(self, what: str) -> StateSchemaError:
        return StateSchemaError(f"is truncated: it ends inside {what} (at byte {len(self.data)})", path=self.path,
                                kind="truncated")

    def malformed(self, what: str) -> StateSchemaError:
        return StateSchemaError(f"is not a readable state schema file: {what} is malformed at byte {self.pos}",
                                path=self.path, kind="malformed")

    def utf(self, what: str) -> str:
        if self.pos + 2 > len(self.data) or self.pos + 2 + struct.unpack_from(">H", self.data, self.pos)[0] > len(self.data):
            raise self.truncated(what)
        try:
            text, self.pos = read_java_utf(self.data, self.pos, strict=True)
        except CodecError:
            raise self.malformed(what) from None
        return text

    def int(self, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise self.truncated(what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def count(self, what: str) -> int:
        """A count of things that follow, each at least two bytes: negative or absurd is garbage, more than
        what is left of the file a torn write."""
        n = self.int(">i", what)
        if n < 0 or n > _MAX_COUNT:
            raise self.malformed(what)
        if 2 * n > len(self.data) - self.pos:
            raise self.truncated(what)
        return n

    def chunked(self, what: str) -> str:
        return "".join(self.utf(what) for _ in range(self.count(what)))

    def json(self, text: str, what: str) -> dict:
        try:
            doc = json.loads(text)
        except ValueError:
            raise StateSchemaError(f"is not a readable state schema file: {what} is not JSON ({text[:60]!r})",
                                   path=self.path, kind="malformed") from None
        if not isinstance(doc, dict):
            raise StateSchemaError(f"is not a readable state schema file: {what} is not a JSON object",
                                   path=self.path, kind="malformed")
        return doc


def parse_state_schema(data: bytes, rel: str, path: str, store: str = DEFAULT_COLUMN_FAMILY,
                       batch: int | None = None) -> StateSchemaFile:
    """Parse a state schema file (any version Spark 4.3 writes); raises StateSchemaError naming ``path``."""
    if not data:
        raise StateSchemaError("is empty (0 bytes)", path=path, kind="empty")
    r = _Reader(data, path)
    head = r.utf("the version header")
    if not (head.startswith("v") and head[1:].isdecimal()):
        raise StateSchemaError(f"is not a state schema file: it starts with {head[:20]!r}, not a version like 'v2'",
                               path=path, kind="malformed")
    version = int(head[1:])
    if version > MAX_SCHEMA_VERSION or version < 1:
        raise StateSchemaError(f"is state schema format v{version}; Spark 4.3 (and this tool) read up to "
                               f"v{MAX_SCHEMA_VERSION}", path=path,
                               kind="unknown-version" if version > MAX_SCHEMA_VERSION else "malformed")
    if version == 1:
        families = [ColumnFamilySchema(DEFAULT_COLUMN_FAMILY, r.json(r.utf("the key schema"), "the key schema"),
                                       r.json(r.utf("the value schema"), "the value schema"))]
    elif version == 2:
        key = r.json(r.chunked("the key schema"), "the key schema")
        families = [ColumnFamilySchema(DEFAULT_COLUMN_FAMILY, key, r.json(r.chunked("the value schema"),
                                                                          "the value schema"))]
    else:
        families = []
        for _ in range(r.count("the number of column families")):
            name = r.utf("a column family name")
            what = f"column family {name!r}"
            key_id = r.int(">h", f"the key schema id of {what}")
            key = r.json(r.chunked(f"the key schema of {what}"), f"the key schema of {what}")
            value_id = r.int(">h", f"the value schema id of {what}")
            value = r.json(r.chunked(f"the value schema of {what}"), f"the value schema of {what}")
            encoder = r.json(r.chunked(f"the key encoder of {what}"), f"the key encoder of {what}")
            user_key_text = r.chunked(f"the user key schema of {what}")
            user_key = None if user_key_text == _NO_USER_KEY_SCHEMA else r.json(user_key_text,
                                                                                 f"the user key schema of {what}")
            families.append(ColumnFamilySchema(name, key, value, key_id, value_id, encoder, user_key))
    if r.pos != len(data):
        raise StateSchemaError(f"is not a readable state schema file: {len(data) - r.pos} bytes follow the v{version} "
                               "schema", path=path, kind="malformed")
    return StateSchemaFile(rel, store, version, tuple(families), batch)


def simple_string(data_type) -> str:
    """Spark's ``DataType.simpleString`` of a type in Spark's JSON form: ``struct<key:string,n:bigint>``."""
    if isinstance(data_type, str):
        return _SIMPLE_NAMES.get(data_type, data_type)
    if not isinstance(data_type, dict):
        return json.dumps(data_type)
    kind = data_type.get("type")
    if kind == "struct":
        fields = ",".join(f"{f.get('name')}:{simple_string(f.get('type'))}" for f in data_type.get("fields", []))
        return f"struct<{fields}>"
    if kind == "array":
        return f"array<{simple_string(data_type.get('elementType'))}>"
    if kind == "map":
        return f"map<{simple_string(data_type.get('keyType'))},{simple_string(data_type.get('valueType'))}>"
    if kind == "udt":
        return simple_string(data_type.get("sqlType"))
    return json.dumps(data_type, separators=(",", ":"))
