"""URLs and paths: what the user types, what fsspec wants, what Spark writes into its logs."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

LOCAL_SCHEMES = {"", "file", "local"}
# Hadoop spells S3 as s3a/s3n; fsspec's s3fs answers to all of them.
SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs", "local": "file"}


@dataclass(frozen=True)
class Location:
    """A parsed URL: fsspec protocol plus the path fsspec uses (no protocol for remote stores)."""

    scheme: str  # canonical fsspec protocol: "file", "s3", "gs", "abfs", "hdfs", ...
    path: str  # absolute local path, or "bucket/key" for object stores
    original_scheme: str = ""  # as typed (s3a stays s3a when we echo it back)

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def url(self, path: str | None = None) -> str:
        p = self.path if path is None else path
        if self.is_local:
            return p
        return f"{self.original_scheme or self.scheme}://{p}"


def parse_url(url: str) -> Location:
    """Parse a user-supplied location (local path, file://, s3://, s3a://, gs://, hdfs://...)."""
    if not url:
        raise ValueError("empty path")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter, not a scheme
        scheme = ""
    if scheme in LOCAL_SCHEMES:
        raw = unquote(parts.path) if scheme else url
        return Location("file", normalize_local(raw), scheme or "")
    canonical = SCHEME_ALIASES.get(scheme, scheme)
    path = (parts.netloc + parts.path).rstrip("/")
    return Location(canonical, path, scheme)


def place_key(url: str) -> str:
    """One key per place, whatever its spelling: ``s3a://`` and ``s3://`` alike, a path and its ``file://``
    URL, and on local disk every spelling of one directory (symbolic links, ``//``) resolved to it."""
    try:
        loc = parse_url(url)
    except ValueError:
        return url
    if loc.is_local:
        return f"file://{os.path.realpath(loc.path)}"
    return f"{loc.scheme}://{loc.path.rstrip('/')}"


def how_places_overlap(url_a: str, url_b: str) -> str | None:
    """How the place at ``url_a`` stands to the one at ``url_b``, by place (``place_key``: two spellings of one
    directory are one place): "is the same place as", "contains", "lies inside", or None when neither holds the
    other."""
    place_a, place_b = place_key(url_a).rstrip("/"), place_key(url_b).rstrip("/")
    if place_a == place_b:
        return "is the same place as"
    if place_b.startswith(place_a + "/"):
        return "contains"
    if place_a.startswith(place_b + "/"):
        return "lies inside"
    return None


def normalize_local(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if parts else base


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


def dirname(path: str) -> str:
    return posixpath.dirname(path.rstrip("/"))


def spark_url_to_location(url: str) -> Location:
    """A path as Spark writes it into source/sink logs (URL-encoded, qualified)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in LOCAL_SCHEMES:
        return Location("file", unquote(parts.path) or "/", scheme)
    canonical = SCHEME_ALIASES.get(scheme, scheme)
    return Location(canonical, unquote(parts.netloc + parts.path), scheme)


# What java.net.URI's multi-argument constructors leave unquoted in a path besides letters and digits
# (unreserved and punct characters, "/" and "@"); Hadoop's ``Path.toUri`` builds its URI with one.
_URI_PATH_SAFE = frozenset("/-._~!$&'()*+,;=:@")


def uri_path(path: str) -> str:
    """``path`` quoted as Hadoop's ``Path.toUri().toString()`` quotes it, which is how Spark writes file
    paths into its source and sink logs: ASCII characters a URI path cannot hold are percent-encoded
    (UTF-8), ``%`` included; other characters, non-ASCII letters among them, stay as they are, except
    control and space characters. ``/tmp/in dir/café`` is ``/tmp/in%20dir/café``: encoding the ``é`` as
    ``%C3%A9`` would name another file to Spark, whose file source compares these strings to decide which
    files it has read."""
    import unicodedata
    from urllib.parse import quote

    out = []
    for ch in path:
        if ch.isascii():
            out.append(ch if ch.isalnum() or ch in _URI_PATH_SAFE else quote(ch, safe=""))
        elif unicodedata.category(ch) in ("Cc", "Zs", "Zl", "Zp"):  # Java's isISOControl, isSpaceChar
            out.append(quote(ch, safe=""))
        else:
            out.append(ch)
    return "".join(out)


def hadoop_path_to_location(path: str) -> Location:
    """A path as Hadoop's ``Path.toString`` writes it (qualified, not URL-encoded): ``file:/tmp/ck``,
    ``s3a://bucket/ck``. Spark writes these into operator metadata (state schema file paths)."""
    scheme, sep, rest = path.partition(":")
    if not sep or "/" in scheme or len(scheme) == 1:
        return Location("file", posixpath.normpath(path), "")
    scheme = scheme.lower()
    if scheme in LOCAL_SCHEMES:
        if rest.startswith("//"):  # file:///tmp/ck, or file://host/tmp/ck
            rest = "/" + rest[2:].partition("/")[2]
        return Location("file", posixpath.normpath(rest), scheme)
    return Location(SCHEME_ALIASES.get(scheme, scheme), rest.lstrip("/").rstrip("/"), scheme)


def hadoop_path(loc: Location) -> str:
    """``Path.toString`` of a location, as ``hadoop_path_to_location`` reads it back."""
    if loc.is_local:
        return f"file:{loc.path}"
    scheme = {"s3": "s3a"}.get(loc.original_scheme or loc.scheme, loc.original_scheme or loc.scheme)
    return f"{scheme}://{loc.path}"
