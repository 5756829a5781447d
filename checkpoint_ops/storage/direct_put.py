"""Object stores (S3, GCS, Azure) through fsspec: write the final key directly.

An object store makes an object visible only when its upload completes, so there is no temp
file: the writer buffers (in memory, then in an anonymous local temp file that vanishes with the
process, even when it is killed), and ``close()`` issues one PUT (or streams a multipart upload and
completes it). ``cancel()`` simply never uploads. ``overwrite=False`` is a conditional put
(``If-None-Match: *``; fsspec mode ``"create"``/``"xb"``), so of two racing writers one gets
HTTP 412 and sees ``FileExistsError``. A multipart upload that fails (or loses that race) is
aborted; one whose process is killed stays open at the store, unlisted: ``pending_uploads`` finds
it and ``abort_uploads`` drops it.
"""

from __future__ import annotations

import asyncio
import errno
import tempfile
from typing import Iterable

from . import killswitch
from .manager import AtomicWriter, CheckpointFileManager, FileInfo, PendingUpload
from .paths import Location
from .rename import _fileinfo

# Buffer in memory up to this size, then spool to a local temp file.
_SPOOL_BYTES = 16 * 2**20
# Larger uploads stream through fsspec's multipart writer instead of one PUT.
_SINGLE_PUT_MAX = 64 * 2**20
_CHUNK = 8 * 2**20  # what a multipart upload is fed at a time
_S3_DELETE_BATCH = 1000
_READ_CONCURRENCY = 32


def _is_precondition_failed(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}"
    code = getattr(e, "response", {}).get("Error", {}).get("Code") if hasattr(e, "response") else None
    return code == "PreconditionFailed" or "PreconditionFailed" in text or "412" in text


class _DirectPutWriter(AtomicWriter):
    def __init__(self, fm: "DirectPutFileManager", path: str, overwrite: bool):
        super().__init__(path, overwrite)
        self._fm = fm
        self._buf = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
        self._size = 0

    def write(self, data: bytes) -> int:
        self._size += len(data)
        return self._buf.write(data)

    def _publish(self) -> None:
        fm = self._fm
        self._buf.seek(0)
        try:
            if self._size <= _SINGLE_PUT_MAX:
                data = self._buf.read()
                fm._count("put")
                fm.fs.pipe_file(self.path, data, mode="overwrite" if self.overwrite else "create")
            else:
                fm._count("multipart-put")
                self._multipart(fm)
        except Exception as e:
            if not self.overwrite and (_is_precondition_failed(e) or isinstance(e, FileExistsError)):
                raise FileExistsError(errno.EEXIST, "file exists (conditional put lost)", self.path) from e
            raise
        finally:
            fm.fs.invalidate_cache(self.path)

    def _multipart(self, fm: "DirectPutFileManager") -> None:
        """Stream the buffer through fsspec's multipart writer. If anything fails (a part, or the
        conditional completion a racing writer won), the upload is aborted: left open, its parts
        would stay in the bucket, unlisted and billed. Closing fsspec's file after a failure would
        instead complete the upload with the parts sent so far."""
        out = fm.fs.open(self.path, "wb" if self.overwrite else "xb")
        try:
            while chunk := self._buf.read(_CHUNK):
                killswitch.tick()  # each chunk sent is a change at the store (its parts persist)
                out.write(chunk)
            out.close()
        except BaseException:
            _abandon(out)
            raise

    def _discard(self) -> None:
        self._buf.close()


def _abandon(out) -> None:
    """Drop an unfinished fsspec upload without publishing anything (aborts its multipart upload)."""
    try:
        discard = getattr(out, "discard", None)
        if discard is not None:
            discard()
    finally:
        out.closed = True  # so neither close() nor the garbage collector completes it


class DirectPutFileManager(CheckpointFileManager):
    """S3/GCS/Azure through fsspec: direct (conditional) put, batched deletes, one-LIST walks."""

    strategy = "direct-put"
    hadoop_crc = False  # S3A/GCS/ABFS connectors never read Hadoop .crc sidecars
    atomic_rename = False  # rename is copy + delete

    def __init__(self, location: Location, storage_options: dict):
        super().__init__(location)
        import fsspec

        opts = dict(storage_options)
        opts.setdefault("skip_instance_cache", True)  # our own counters, our own cache
        if location.scheme == "s3":
            opts.setdefault("use_listings_cache", False)
        self.fs = fsspec.filesystem(location.scheme, **opts)
        self._http_counted = self._hook_s3_request_counter()
        # s3fs HEADs before a GET to decide on ranged reads; checkpoint files are small: one GET.
        self._cat_kwargs = {"max_concurrency": 1} if location.scheme == "s3" else {}

    # S3: count real HTTP requests (retries included) through botocore's event system.
    def _hook_s3_request_counter(self) -> bool:
        if self.location.scheme != "s3":
            return False
        try:
            self.fs.connect()
            events = self.fs.s3.meta.events
        except Exception:  # pragma: no cover - other s3fs versions
            return False

        def on_send(request=None, event_name: str = "", **_):
            op = event_name.rsplit(".", 1)[-1] if event_name else "request"
            self.counter.add(op)

        events.register("before-send.s3", on_send)
        return True

    def _count(self, kind: str, n: int = 1) -> None:
        if not self._http_counted:
            self.counter.add(kind, n)

    def create_atomic(self, path: str, overwrite: bool = False) -> AtomicWriter:
        return _DirectPutWriter(self, path, overwrite)

    def read_bytes(self, path: str) -> bytes:
        self._count("get")
        return self.fs.cat_file(path, **self._cat_kwargs)

    def read_prefix(self, path: str, n: int) -> bytes:
        self._count("get")
        return self.fs.cat_file(path, start=0, end=n)

    def open_read(self, path: str):
        self._count("get")
        return self.fs.open(path, "rb", block_size=_SINGLE_PUT_MAX, cache_type="readahead")

    def read_many(self, paths: Iterable[str], errors: dict | None = None) -> dict[str, bytes | None]:
        paths = list(paths)
        if not paths:
            return {}
        if not getattr(self.fs, "async_impl", False):
            return super().read_many(paths, errors)
        from fsspec.asyn import sync

        sem_holder: dict = {}

        async def one(p: str):
            async with sem_holder["sem"]:
                self._count("get")
                try:
                    return p, await self.fs._cat_file(p, **self._cat_kwargs)
                except FileNotFoundError:
                    return p, None
                except OSError as e:
                    if errors is None:
                        raise
                    errors[p] = e
                    return p, None

        async def run():
            sem_holder["sem"] = asyncio.Semaphore(_READ_CONCURRENCY)
            return await asyncio.gather(*(one(p) for p in paths))

        return dict(sync(self.fs.loop, run))

    def info(self, path: str) -> FileInfo | None:
        self._count("head")
        try:
            d = self.fs.info(path)
        except FileNotFoundError:
            return None
        if d.get("type") == "directory":
            return None
        return _fileinfo(d)

    def exists(self, path: str) -> bool:
        return self.info(path) is not None

    def list(self, path: str) -> list[FileInfo]:
        self._count("list")
        try:
            return [_fileinfo(d) for d in self.fs.ls(path, detail=True, refresh=True)]
        except FileNotFoundError:
            return []

    def walk(self, path: str, empty_dirs: bool = False) -> list[FileInfo]:
        if self.location.scheme == "s3":
            return self._s3_walk(path)
        self._count("list")
        try:
            found = self.fs.find(path.rstrip("/") + "/", detail=True)
        except FileNotFoundError:
            return []
        return [_fileinfo(d) for d in found.values() if d.get("type") != "directory"]

    def _s3_walk(self, path: str) -> list[FileInfo]:
        """Exactly one ListObjectsV2 per 1,000 keys, and nothing else (no existence probes)."""
        bucket, _, key = path.strip("/").partition("/")
        kwargs = {"Bucket": bucket, "Prefix": f"{key}/" if key else ""}
        out = []
        while True:
            resp = self.fs.call_s3("list_objects_v2", **kwargs)
            for o in resp.get("Contents", []):
                mtime = o.get("LastModified")
                out.append(FileInfo(f"{bucket}/{o['Key']}", int(o.get("Size", 0)),
                                    mtime.timestamp() if hasattr(mtime, "timestamp") else None))
            if not resp.get("IsTruncated"):
                return out
            kwargs["ContinuationToken"] = resp["NextContinuationToken"]

    def delete_many(self, paths: Iterable[str]) -> None:
        paths = list(dict.fromkeys(paths))
        if not paths:
            return
        if self.location.scheme != "s3":
            for p in paths:
                self._count("delete")
                try:
                    self.fs.rm_file(p)
                except FileNotFoundError:
                    pass
            return
        by_bucket: dict[str, list[str]] = {}
        for p in paths:
            bucket, _, key = p.partition("/")
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), _S3_DELETE_BATCH):
                batch = keys[i : i + _S3_DELETE_BATCH]
                self._count("delete-batch")
                resp = self.fs.call_s3(
                    "delete_objects",
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
                if errors:
                    e = errors[0]
                    raise OSError(f"delete failed for s3://{bucket}/{e.get('Key')}: {e.get('Code')} {e.get('Message')}")
        for p in paths:
            self.fs.invalidate_cache(p)

    def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        if not overwrite and self.exists(dst):
            raise FileExistsError(errno.EEXIST, "file exists", dst)
        self.copy(src, dst)
        self.delete_many([src])

    def copy(self, src: str, dst: str) -> None:
        self._count("copy")
        self.fs.copy(src, dst)
        self.fs.invalidate_cache(dst)

    def mkdirs(self, path: str) -> None:
        pass  # object stores have no directories

    def move_many(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Server-side copies (concurrently), then batched deletes."""
        if not pairs:
            return []
        from fsspec.asyn import sync

        missing: list[str] = []
        sem_holder: dict = {}

        async def one(src: str, dst: str):
            async with sem_holder["sem"]:
                self._count("copy")
                try:
                    if self.location.scheme == "s3":
                        try:
                            await self.fs._copy_basic(src, dst)  # one CopyObject, no HEAD
                        except FileNotFoundError:
                            raise
                        except (ValueError, OSError):
                            await self.fs._cp_file(src, dst)  # over 5 GB: multipart copy
                    else:
                        await self.fs._cp_file(src, dst)
                except FileNotFoundError:
                    missing.append(src)

        async def run():
            sem_holder["sem"] = asyncio.Semaphore(_READ_CONCURRENCY)
            await asyncio.gather(*(one(s, d) for s, d in pairs))

        sync(self.fs.loop, run)
        gone = set(missing)
        self.delete_many([s for s, _ in pairs if s not in gone])
        return missing

    def pending_uploads(self, path: str) -> list[PendingUpload]:
        """S3's incomplete multipart uploads below ``path`` (ListMultipartUploads, paginated)."""
        if self.location.scheme != "s3":
            return []
        bucket, _, key = path.strip("/").partition("/")
        kwargs = {"Bucket": bucket, "Prefix": f"{key}/" if key else ""}
        out = []
        while True:
            self._count("list-uploads")
            resp = self.fs.call_s3("list_multipart_uploads", **kwargs)
            for u in resp.get("Uploads", []):
                started = u.get("Initiated")
                out.append(PendingUpload(f"{bucket}/{u['Key']}", u["UploadId"],
                                         started.timestamp() if hasattr(started, "timestamp") else None))
            if not resp.get("IsTruncated"):
                return out
            kwargs.update(KeyMarker=resp.get("NextKeyMarker"), UploadIdMarker=resp.get("NextUploadIdMarker"))

    def abort_uploads(self, uploads: list[PendingUpload]) -> None:
        for u in uploads:
            if self.location.scheme != "s3":
                raise NotImplementedError(f"{self.location.scheme} uploads cannot be aborted here")
            bucket, _, key = u.path.partition("/")
            self._count("abort-upload")
            try:
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=u.upload_id)
            except FileNotFoundError:
                pass  # already aborted or completed (s3fs maps NoSuchUpload to FileNotFoundError)
            except Exception as e:
                if "NoSuchUpload" not in f"{type(e).__name__} {e}":
                    raise

    def versioning_enabled(self, path: str) -> bool:
        if self.location.scheme != "s3":
            return False
        self._count("get-versioning")
        resp = self.fs.call_s3("get_bucket_versioning", Bucket=path.split("/", 1)[0])
        return resp.get("Status") == "Enabled"

    def undelete_many(self, paths: list[str]) -> list[str]:
        """Remove the newest delete marker of each path, so its previous version is current again."""
        if self.location.scheme != "s3":
            return super().undelete_many(paths)
        by_bucket: dict[str, set[str]] = {}
        for p in paths:
            b, _, k = p.partition("/")
            by_bucket.setdefault(b, set()).add(k)
        not_restored = []
        for bucket, keys in by_bucket.items():
            prefix = _common_prefix(sorted(keys))
            markers: dict[str, str] = {}
            kwargs = {"Bucket": bucket, "Prefix": prefix}
            while True:
                self._count("list-versions")
                resp = self.fs.call_s3("list_object_versions", **kwargs)
                for m in resp.get("DeleteMarkers", []):
                    if m.get("IsLatest") and m["Key"] in keys:
                        markers[m["Key"]] = m["VersionId"]
                if not resp.get("IsTruncated"):
                    break
                kwargs.update(KeyMarker=resp.get("NextKeyMarker"), VersionIdMarker=resp.get("NextVersionIdMarker"))
            not_restored += [f"{bucket}/{k}" for k in keys if k not in markers]
            items = sorted(markers.items())
            for i in range(0, len(items), _S3_DELETE_BATCH):
                batch = items[i : i + _S3_DELETE_BATCH]
                self._count("delete-batch")
                resp = self.fs.call_s3("delete_objects", Bucket=bucket, Delete={
                    "Objects": [{"Key": k, "VersionId": v} for k, v in batch], "Quiet": True})
                if resp.get("Errors"):
                    e = resp["Errors"][0]
                    raise OSError(f"undelete failed for s3://{bucket}/{e.get('Key')}: {e.get('Code')} {e.get('Message')}")
            for k in markers:
                self.fs.invalidate_cache(f"{bucket}/{k}")
        return not_restored


def _common_prefix(keys: list[str]) -> str:
    if not keys:
        return ""
    a, b = keys[0], keys[-1]
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
