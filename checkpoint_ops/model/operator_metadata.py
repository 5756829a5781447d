"""Operator metadata: which stateful operator owns ``state/<op>``, and its stores (``OperatorStateMetadata``).

* v1, ``state/<op>/_metadata/metadata``, written once by every operator but transformWithState:
  ``v1`` then ``{"operatorInfo":{"operatorId","operatorName"},"stateStoreInfo":[{"storeName",
  "numColsPrefixKey","numPartitions"}]}``. Spark 4.3 does not read it to restart (a damaged or missing
  one is rewritten or ignored); Spark's ``state-metadata`` source and this tool read the names from it.
* v2, ``state/<op>/_metadata/v2/<batch>``, written by transformWithState at the first batch of every
  query run: ``v2`` then the same JSON with ``stateSchemaFilePaths`` per store (absolute Hadoop paths of
  the v3 schema files) and ``operatorPropertiesJson`` (a JSON string: time mode, output mode, state
  variables). Spark reads the newest one at or below the batch it restarts from, then the schema files
  it names; a damaged or missing one stops the restart. Spark purges those older than the one in force
  at the oldest retained commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .logfile import LogFormatError, parse_json_line, split_versioned

METADATA_DIR = "_metadata"
V1_FILE = "metadata"
V2_DIR = "v2"


@dataclass(frozen=True)
class StoreMetadata:
    """One store as the operator metadata declares it."""

    name: str
    partitions: int | None
    num_cols_prefix_key: int | None
    schema_paths: tuple[str, ...] = ()  # v2: the v3 schema files Spark reads for it, as Spark wrote them

    def to_dict(self) -> dict:
        return {"name": self.name, "partitions": self.partitions, "num_cols_prefix_key": self.num_cols_prefix_key,
                "schema_paths": list(self.schema_paths)}


@dataclass(frozen=True)
class OperatorMetadata:
    """One parsed operator metadata file."""

    rel: str
    format_version: int  # 1 or 2
    operator_id: int | None
    name: str | None
    stores: tuple[StoreMetadata, ...]
    batch: int | None = None  # v2: the batch whose query run wrote it
    properties: dict | None = None  # v2: operatorPropertiesJson, parsed

    def to_dict(self) -> dict:
        return {"path": self.rel, "format_version": self.format_version, "batch": self.batch,
                "operator_id": self.operator_id, "name": self.name, "stores": [s.to_dict() for s in self.stores],
                "properties": self.properties}


def parse_operator_metadata(data: bytes, rel: str, path: str, batch: int | None = None) -> OperatorMetadata:
    """Parse a v1 or v2 operator metadata file; raises LogFormatError naming ``path``."""
    version, lines = split_versioned(data, path, "operator metadata")
    body = "\n".join(lines).strip()
    if not body:
        raise LogFormatError("operator metadata has a version line but no JSON: Spark cannot read the operator",
                             path=path, kind="truncated", fix="restore it from a backup")
    doc = parse_json_line(body, path, 2, last=True)
    if not isinstance(doc, dict) or not isinstance(doc.get("operatorInfo"), dict) \
            or not isinstance(doc.get("stateStoreInfo"), list):
        raise LogFormatError("operator metadata lacks operatorInfo or stateStoreInfo", path=path, kind="malformed",
                             fix="restore it from a backup")
    info = doc["operatorInfo"]
    stores = []
    for s in doc["stateStoreInfo"]:
        if not isinstance(s, dict):
            raise LogFormatError("operator metadata has a store that is not a JSON object", path=path,
                                 kind="malformed", fix="restore it from a backup")
        paths = s.get("stateSchemaFilePaths")
        if paths is None and s.get("stateSchemaFilePath"):  # the single-path form of Spark 4.0
            paths = [s["stateSchemaFilePath"]]
        stores.append(StoreMetadata(str(s.get("storeName")), _int(s.get("numPartitions")),
                                    _int(s.get("numColsPrefixKey")), tuple(str(p) for p in paths or ())))
    properties = None
    raw = doc.get("operatorPropertiesJson")
    if isinstance(raw, str) and raw:
        try:
            properties = json.loads(raw)
        except ValueError:
            raise LogFormatError("operator metadata has operatorPropertiesJson that is not JSON", path=path,
                                 kind="malformed", fix="restore it from a backup") from None
    return OperatorMetadata(rel, version, _int(info.get("operatorId")), info.get("operatorName"), tuple(stores),
                            batch, properties)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
