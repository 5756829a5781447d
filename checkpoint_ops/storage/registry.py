"""Choosing a file manager: by URL scheme, overridable by name."""

from __future__ import annotations

import os
from typing import Callable, Iterable
from urllib.parse import urlsplit

from ..errors import StorageError
from .direct_put import DirectPutFileManager
from .manager import CheckpointFileManager
from .paths import Location, parse_url
from .rename import LocalFileManager, RenameFileManager

Factory = Callable[[Location, dict], CheckpointFileManager]
_FACTORIES: dict[str, Factory] = {}
_DEFAULT_BY_SCHEME: dict[str, str] = {}

# Any scheme not listed falls back to "rename" (HDFS-like file systems with atomic rename).
FALLBACK_STRATEGY = "rename"
ENV_STRATEGY = "CHECKPOINT_OPS_FILE_MANAGER"


def register_strategy(name: str, factory: Factory, schemes: Iterable[str] = ()) -> None:
    """Make a strategy available by name, and the default for ``schemes``."""
    _FACTORIES[name] = factory
    for s in schemes:
        _DEFAULT_BY_SCHEME[s] = name


def storage_options_from_env(scheme: str, options: dict | None) -> dict:
    """Fill in the S3 endpoint from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` if not given."""
    opts = dict(options or {})
    if scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        given = "endpoint_url" in opts or "endpoint_url" in opts.get("client_kwargs", {})
        if endpoint and not given:
            opts["endpoint_url"] = endpoint
        _check_endpoint(opts, from_env=endpoint and not given)
    return opts


def _check_endpoint(opts: dict, from_env: bool) -> None:
    """An S3 endpoint must be an http(s) URL: without its scheme botocore fails deep inside (an internal error)."""
    endpoint = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
    if endpoint is None:
        return
    try:
        parts = urlsplit(str(endpoint))
        _ = parts.port  # raises for a port that is not a number
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.netloc)
    except ValueError:  # an unclosed IPv6 bracket, a port that is not a number
        valid = False
    if not valid:
        where = ("AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL") \
            if from_env else "the storage option endpoint_url"
        raise StorageError(f"the S3 endpoint {endpoint!r} ({where}) is not an http:// or https:// URL",
                           fix=f"set {where} with its scheme, e.g. http://127.0.0.1:9000 or https://s3.example.com")


def open_file_manager(
    url: str, storage_options: dict | None = None, strategy: str | None = None
) -> tuple[CheckpointFileManager, str]:
    """The file manager for ``url`` and the fsspec path of ``url`` itself.

    The strategy is chosen by scheme unless ``strategy`` (or ``$CHECKPOINT_OPS_FILE_MANAGER``)
    names one.
    """
    try:
        loc = parse_url(url)
    except ValueError as e:
        raise StorageError(f"cannot parse location: {e}", path=url) from e
    name = strategy or os.environ.get(ENV_STRATEGY) or _DEFAULT_BY_SCHEME.get(loc.scheme, FALLBACK_STRATEGY)
    if name not in _FACTORIES:
        raise StorageError(
            f"unknown file manager strategy {name!r}",
            path=url,
            fix=f"use one of: {', '.join(sorted(_FACTORIES))}",
        )
    try:
        opts = storage_options_from_env(loc.scheme, storage_options)
    except StorageError as e:  # a misconfigured endpoint: named with the location it was to open
        raise StorageError(e.problem, path=url, fix=e.fix) from None
    try:
        return _FACTORIES[name](loc, opts), loc.path
    except (ImportError, ValueError, TypeError) as e:
        raise StorageError(
            f"cannot open a {loc.scheme!r} file system: {e}",
            path=url,
            fix="check --storage-options and that the fsspec driver for this scheme is installed",
        ) from e


register_strategy("local-rename", lambda loc, opts: LocalFileManager(loc), ["file"])
register_strategy("rename", lambda loc, opts: RenameFileManager(loc, opts), ["hdfs", "viewfs", "webhdfs", "memory"])
register_strategy("direct-put", lambda loc, opts: DirectPutFileManager(loc, opts), ["s3", "gs", "abfs", "az", "adl"])
