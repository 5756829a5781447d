"""Checksum sidecars Spark leaves next to checkpoint files.

Two unrelated kinds share the ``.crc`` suffix (reference §1.4):

* Hadoop ``ChecksumFs`` sidecars ``.<name>.crc`` on local file systems: the bytes ``crc\\0``, a
  big-endian int32 bytes-per-checksum (512), then one big-endian CRC32 per 512-byte chunk.
  Reads through Hadoop's FileSystem API verify them, so a stale one breaks Spark; a missing one
  is accepted silently.
* Spark checksum files ``<name>.crc`` (4.1+, state stores on checkpoint format V2): one JSON
  object with a signed CRC32C of the main file.
"""

from __future__ import annotations

import json
import re
import struct
import time
import zlib

HADOOP_CRC_MAGIC = b"crc\x00"
HADOOP_BYTES_PER_CHECKSUM = 512

# Names of files that can carry a Spark checksum file: state store files.
_STATE_FILE = re.compile(r"^\d+(?:_[0-9a-fA-F-]{36})?\.(?:zip|changelog|delta|snapshot)$")


def hadoop_crc_name(name: str) -> str:
    """Name of the Hadoop ChecksumFs sidecar of ``name``."""
    return f".{name}.crc"


def spark_checksum_name(name: str) -> str:
    """Name of the Spark checksum file of ``name``."""
    return f"{name}.crc"


def is_hadoop_crc_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".crc") and len(name) > 5


def hadoop_crc_target(name: str) -> str:
    """The file a ``.<name>.crc`` sidecar belongs to."""
    return name[1:-4]


def may_have_spark_checksum(name: str) -> bool:
    return bool(_STATE_FILE.match(name))


def sidecar_names(name: str) -> list[str]:
    """Every sidecar name that may accompany ``name`` (existence not checked)."""
    names = [hadoop_crc_name(name)]
    if may_have_spark_checksum(name):
        names += [spark_checksum_name(name), hadoop_crc_name(spark_checksum_name(name))]
    return names


def hadoop_crc_bytes(data: bytes, bytes_per_checksum: int = HADOOP_BYTES_PER_CHECKSUM) -> bytes:
    """The content Hadoop's ChecksumFs writes for a file holding ``data``."""
    out = bytearray(HADOOP_CRC_MAGIC)
    out += struct.pack(">i", bytes_per_checksum)
    for start in range(0, len(data), bytes_per_checksum):
        out += struct.pack(">I", zlib.crc32(data[start : start + bytes_per_checksum]) & 0xFFFFFFFF)
    return bytes(out)


def hadoop_crc_size(file_size: int, bytes_per_checksum: int = HADOOP_BYTES_PER_CHECKSUM) -> int:
    """Size of the sidecar for a file of ``file_size`` bytes (lets fsck spot stale ones cheaply)."""
    return 8 + 4 * -(-file_size // bytes_per_checksum)


def hadoop_crc_matches(data: bytes, crc: bytes) -> bool:
    if len(crc) < 8 or crc[:4] != HADOOP_CRC_MAGIC:
        return False
    (bpc,) = struct.unpack(">i", crc[4:8])
    if bpc <= 0:
        return False
    return hadoop_crc_bytes(data, bpc) == crc


class HadoopCrc:
    """The ``.crc`` sidecar of a file written in pieces (memory: four bytes per 512 of content)."""

    def __init__(self, bytes_per_checksum: int = HADOOP_BYTES_PER_CHECKSUM):
        self.bpc = bytes_per_checksum
        self._tail = b""
        self._sums = bytearray()

    def update(self, data: bytes) -> None:
        data = self._tail + data if self._tail else data
        bpc, n = self.bpc, len(data) - len(data) % self.bpc
        for start in range(0, n, bpc):
            self._sums += struct.pack(">I", zlib.crc32(data[start:start + bpc]) & 0xFFFFFFFF)
        self._tail = bytes(data[n:])

    def digest(self) -> bytes:
        tail = struct.pack(">I", zlib.crc32(self._tail) & 0xFFFFFFFF) if self._tail else b""
        return HADOOP_CRC_MAGIC + struct.pack(">i", self.bpc) + bytes(self._sums) + tail


class Crc32c:
    """CRC32C of a file written in pieces (native ``google-crc32c`` when installed)."""

    def __init__(self):
        self.size = 0
        try:
            import google_crc32c

            self._native = google_crc32c.Checksum()
        except ImportError:  # pragma: no cover - the dependency is declared; pure Python still works
            self._native = None
            self._crc = 0xFFFFFFFF

    def update(self, data: bytes) -> None:
        self.size += len(data)
        if self._native is not None:
            self._native.update(data)
            return
        crc, table = self._crc, _CRC32C
        for b in data:
            crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
        self._crc = crc

    def value(self) -> int:
        if self._native is not None:
            return int.from_bytes(self._native.digest(), "big")
        return self._crc ^ 0xFFFFFFFF


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli), as ``java.util.zip.CRC32C`` computes it."""
    c = Crc32c()
    c.update(data)
    return c.value()


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def spark_checksum_json(data: bytes | Crc32c, *, timestamp_ms: int | None = None) -> bytes:
    """A Spark checksum file for ``data`` (or a finished ``Crc32c`` of it; Spark stores the CRC32C as a
    signed int)."""
    if not isinstance(data, Crc32c):
        c = Crc32c()
        c.update(data)
        data = c
    doc = {
        "algorithm": "CRC32C",
        "value": _signed32(data.value()),
        "mainFileSize": data.size,
        "timestampMs": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        "creator": {"executorId": "checkpoint-ops", "taskInfo": ""},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def spark_checksum_matches(data: bytes, checksum_file: bytes) -> bool:
    try:
        doc = json.loads(checksum_file)
    except ValueError:
        return False
    if not isinstance(doc, dict) or doc.get("algorithm") != "CRC32C":
        return False
    return doc.get("value") == _signed32(crc32c(data)) and doc.get("mainFileSize") == len(data)
