"""Just enough decompression to read the header of a state changelog.

Spark compresses state files with ``spark.sql.streaming.stateStore.compression.codec`` (default
lz4: lz4-java's ``LZ4BlockOutputStream`` framing, reference §5.1). We only ever need the first
few hundred bytes (the changelog version and lineage), so a small pure-Python LZ4 block decoder
avoids a native dependency. zstd is read when the optional ``zstandard`` package is installed.
"""

from __future__ import annotations

import struct

LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = len(LZ4_MAGIC) + 1 + 4 + 4 + 4
_METHOD_RAW = 0x10
_METHOD_LZ4 = 0x20


class CodecError(ValueError):
    pass


def _extend(n: int, src: bytes, i: int) -> tuple[int, int]:
    """A 4-bit length of 15 continues in following bytes, each added until one is not 255."""
    if n == 15:
        while True:
            b = src[i]
            i += 1
            n += b
            if b != 255:
                break
    return n, i


def lz4_block_decompress(src: bytes, expected_size: int) -> bytes:
    """Decode one raw LZ4 block (the format inside each LZ4Block frame)."""
    dst = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        lit, i = _extend(token >> 4, src, i)
        dst += src[i : i + lit]
        i += lit
        if i >= n:
            break  # the last sequence has literals only
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(dst):
            raise CodecError("corrupt LZ4 block (bad match offset)")
        mlen, i = _extend(token & 15, src, i)
        mlen += 4
        start = len(dst) - offset
        if offset >= mlen:
            dst += dst[start : start + mlen]
        else:  # overlapping copy, byte by byte
            for k in range(mlen):
                dst.append(dst[start + k])
    if len(dst) != expected_size:
        raise CodecError(f"corrupt LZ4 block (got {len(dst)} bytes, expected {expected_size})")
    return bytes(dst)


def lz4_stream_prefix(data: bytes, want: int) -> bytes:
    """Decompress LZ4Block frames until at least ``want`` bytes (or the end) are available."""
    out = bytearray()
    pos = 0
    while len(out) < want and pos + _LZ4_HEADER <= len(data):
        if data[pos : pos + 8] != LZ4_MAGIC:
            raise CodecError("not an lz4-java block stream (missing 'LZ4Block' magic)")
        token = data[pos + 8]
        clen, dlen, _checksum = struct.unpack_from("<iii", data, pos + 9)
        pos += _LZ4_HEADER
        if dlen == 0:  # end-of-stream marker
            break
        payload = data[pos : pos + clen]
        if len(payload) < clen:
            break  # we were given a prefix of the file: stop at the last whole block
        pos += clen
        method = token & 0xF0
        if method == _METHOD_RAW:
            out += payload
        elif method == _METHOD_LZ4:
            out += lz4_block_decompress(payload, dlen)
        else:
            raise CodecError(f"unknown LZ4Block compression method 0x{method:02x}")
    return bytes(out)


def decompress_prefix(data: bytes, codec: str, want: int = 70_000) -> bytes:
    codec = (codec or "lz4").lower()
    if codec.endswith("lz4compressioncodec") or codec == "lz4":
        return lz4_stream_prefix(data, want)
    if codec.endswith("zstdcompressioncodec") or codec == "zstd":
        try:
            import zstandard
        except ImportError as e:
            raise CodecError("reading zstd state files needs the optional 'zstandard' package") from e
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)[:want]
    raise CodecError(f"state compression codec {codec!r} is not supported for reading changelog headers")


def read_java_utf(buf: bytes, pos: int, strict: bool = False) -> tuple[str, int]:
    """``DataInputStream.readUTF``: 2-byte big-endian length, then (modified) UTF-8.

    ``strict``: bytes that are not modified UTF-8 raise CodecError instead of becoming U+FFFD.
    """
    if pos + 2 > len(buf):
        raise CodecError("truncated string")
    (n,) = struct.unpack_from(">H", buf, pos)
    raw = buf[pos + 2 : pos + 2 + n]
    if len(raw) < n:
        raise CodecError("truncated string")
    if strict:
        return decode_modified_utf8(raw), pos + 2 + n
    return raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "replace"), pos + 2 + n


def decode_modified_utf8(raw: bytes) -> str:
    """Java's modified UTF-8: NUL is ``C0 80`` and a character outside the BMP is two 3-byte
    surrogates. Raises CodecError on anything else that is not UTF-8."""
    try:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError as e:
        raise CodecError(f"not modified UTF-8 ({e.reason})") from None


def changelog_header(prefix: bytes) -> tuple[int, list[tuple[int, str]] | None]:
    """(changelog format version, lineage or None) from the decompressed start of a changelog."""
    if len(prefix) >= 4 and prefix[:2] == b"\x00\x02" and prefix[2:3] == b"v" and prefix[3:4].isdigit():
        version, pos = read_java_utf(prefix, 0)
        v = int(version[1:])
        if v in (3, 4):
            import json

            text, _ = read_java_utf(prefix, pos)
            items = json.loads(text)
            return v, [(int(i["version"]), str(i["checkpointUniqueId"])) for i in items]
        return v, None
    return 1, None  # v1 changelogs start directly with a record (int key length)
