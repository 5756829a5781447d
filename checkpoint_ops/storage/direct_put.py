"""Object stores (S3, GCS, Azure) through fsspec: write the final key directly.

An object store makes an object visible only when its upload completes, so there is no temp
file: the writer buffers (in memory, then in an anonymous local temp file that vanishes with the
process, even when it is killed), and ``close()`` issues one PUT (or streams a multipart upload and
completes it). ``cancel()`` simply never uploads. ``overwrite=False`` is a conditional put
(``If-None-Match: *``; fsspec mode ``"create"``/``"xb"``), so of two racing writers one gets
HTTP 412 and sees ``FileExistsError``. A multipart upload that fails (or loses that race) is
aborted; one whose process is killed stays open at the store, unlisted: ``pending_uploads`` finds
it and ``abort_uploads`` drops it.

Every request goes through one retry policy (``retry.py``); on S3 the client libraries' own
retries are off, so attempts never multiply. On S3 what is retried is one request, never a sequence
(a sequence of four fails about four times as often, and its failed LIST would be counted as a failed
copy): a copy is one CopyObject (not s3fs's ``copy``, which LISTs and HEADs first), ``info`` one HEAD
(not s3fs's, which LISTs after a 404), and retries are counted by the request that failed. The one
exception left is a multipart upload (over 64 MiB), retried whole. What a retry means here:

* a conditional PUT whose reply was lost may have been stored: its retry (ours, or aiohttp's
  resend on a dead reused connection, which nothing above it sees) gets 412. A 412 to a retry is
  read back: if the object holds exactly our bytes the write is done, else the race was lost. A 412
  to the first attempt, where each attempt is one send (``_sends_once``: botocore's attempts and
  aiohttp's resend off), means the object was there before: ``FileExistsError``, nothing read (a
  backup run again after a stop then counts what the stopped run stored as already there, not new,
  and reads none of it back);
* a retried delete (one key or a batch) of keys already gone succeeds: S3 deletes are idempotent.
  A multi-object delete answered ``200 OK`` may still name keys it failed (a per-key ``<Error>``):
  those with a transient code (``InternalError``, ``SlowDown``...) are sent again, alone, through the
  retry policy (counted as ``DeleteObjects`` retries, ``StoreUnavailableError`` when the attempts run
  out); any other code (``AccessDenied``...) is an answer, raised at once (``PermissionError`` for
  denied, ``OSError`` otherwise);
* on a versioned bucket a retried delete adds a delete marker per attempt, so one key may end up with
  several markers above its version. ``undelete_many`` removes every marker above the newest real
  version (not only the newest marker), then lists once more and returns each path that is still
  missing: its result is what stayed deleted, never a guess;
* a retried copy copies the same source again. A source over 5 GiB, which S3 refuses to copy in one
  CopyObject (400 ``InvalidRequest``), is copied in parts: HEAD, CreateMultipartUpload, UploadPartCopy per
  range (pinned to the source's ETag), CompleteMultipartUpload, each retried on its own; a completion whose
  reply was lost is done if the copy has the source's size; a failed copy aborts its upload;
* a listing page (``walk``, and ``list`` on S3) is retried with its own continuation token, so no key
  is repeated or skipped, and a listing that failed is an error, never read as an empty directory;
* a read whose reply is shorter than its ``Content-Length`` fails in the client and is retried:
  a short object is never parsed. Streams (``open_read``) are ranged GETs, each retried on its own,
  pinned to the first reply's ETag.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import tempfile
from typing import Iterable, Iterator

from ..errors import StoreUnavailableError
from . import killswitch
from .manager import AtomicWriter, CheckpointFileManager, FileChangedError, FileInfo, PendingUpload
from .paths import Location
from .rename import _fileinfo
from .retry import OPTION as RETRY_OPTION
from .retry import Retrier, RetryPolicy, transient_code

# Buffer in memory up to this size, then spool to a local temp file.
_SPOOL_BYTES = 16 * 2**20
# Larger uploads stream through fsspec's multipart writer instead of one PUT.
_SINGLE_PUT_MAX = 64 * 2**20
_PART_BYTES = 8 * 2**20  # multipart uploads: part size (S3's minimum is 5 MiB)
_READ_BLOCK = 64 * 2**20  # streamed reads: bytes per ranged GET (most files take one)
_S3_DELETE_BATCH = 1000
# Copies: S3 copies an object of up to 5 GiB in one CopyObject; a larger one in parts of this size (at least;
# at most _MAX_PARTS parts)
_COPY_PART_BYTES = 512 * 2**20
_MAX_PARTS = 10_000
# Per-key codes of a multi-object delete that mean the object (or version) is already gone: done.
_GONE = frozenset({"NoSuchKey"})
_GONE_VERSION = frozenset({"NoSuchKey", "NoSuchVersion"})
# undelete: at most this many rounds of removing delete markers (each removes at least the newest
# marker of every key still deleted; a retried delete stacks one marker per attempt)
_UNDELETE_ROUNDS = 32
# Paged listings: method -> (request kind for the retry policy, what _count calls it, the markers of the
# next page: (request parameter, reply field), ...)
_PAGED = {
    "list_objects_v2": ("ListObjectsV2", "list", (("ContinuationToken", "NextContinuationToken"),)),
    "list_object_versions": ("ListObjectVersions", "list-versions",
                             (("KeyMarker", "NextKeyMarker"), ("VersionIdMarker", "NextVersionIdMarker"))),
    "list_multipart_uploads": ("ListMultipartUploads", "list-uploads",
                               (("KeyMarker", "NextKeyMarker"), ("UploadIdMarker", "NextUploadIdMarker"))),
}
_READ_CONCURRENCY = 32


def _s3_reply(e: BaseException) -> dict | None:
    """The S3 error reply behind ``e`` (the client error's ``response``, found through what s3fs translated
    it into), or None if no reply is behind it."""
    exc, depth = e, 0
    while exc is not None and depth < 8:
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and "Error" in response:
            return response
        exc, depth = exc.__cause__ or exc.__context__, depth + 1
    return None


def missing_bucket(e: BaseException) -> str | None:
    """The bucket an S3 ``NoSuchBucket`` reply behind ``e`` names, or None."""
    response = _s3_reply(e)
    if response is None or response["Error"].get("Code") != "NoSuchBucket":
        return None
    return str(response["Error"].get("BucketName") or "") or None


def _http_answer(e: BaseException) -> tuple[str, int | None] | None:
    """(error code, HTTP status) of the S3 reply behind ``e``, or None if no reply is behind it."""
    response = _s3_reply(e)
    if response is None:
        return None
    code = str(response["Error"].get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, int(status) if status is not None else (int(code) if code.isdigit() else None)


def _copy_source_too_large(e: BaseException) -> bool:
    """Whether ``e`` is S3's refusal to copy a source over 5 GiB in one CopyObject (400 InvalidRequest: "The
    specified copy source is larger than the maximum allowable size for a copy source")."""
    response = _s3_reply(e)
    return response is not None and response["Error"].get("Code") == "InvalidRequest" and \
        "copy source is larger" in str(response["Error"].get("Message", ""))


def _is_precondition_failed(e: BaseException) -> bool:
    if isinstance(e, FileExistsError):
        return True
    answer = _http_answer(e)
    return answer is not None and (answer[0] == "PreconditionFailed" or answer[1] == 412)


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
        url = fm.url(self.path)
        attempts = 0
        try:
            if self._size <= _SINGLE_PUT_MAX:
                self._buf.seek(0)
                data = self._buf.read()
                mode = "overwrite" if self.overwrite else "create"

                def put():
                    nonlocal attempts
                    attempts += 1
                    fm._count("put")
                    fm.fs.pipe_file(self.path, data, mode=mode)

                fm.retrier.call("PutObject", url, put)
            else:
                def upload():
                    nonlocal attempts
                    attempts += 1
                    self._multipart()

                fm.retrier.call("MultipartUpload", url, upload)
        except Exception as e:
            if self.overwrite or not _is_precondition_failed(e):
                raise
            # 412: an object is there. Ours only if an earlier send of this write was stored after all: never
            # on the first attempt where each attempt is one send; after a retry, if it holds our bytes.
            if (attempts == 1 and fm._sends_once) or not fm._holds(self.path, self._buf, self._size):
                raise FileExistsError(errno.EEXIST, "file exists (conditional put lost)", self.path) from e
        finally:
            fm.fs.invalidate_cache(self.path)

    def _multipart(self) -> None:
        """One multipart upload of the whole buffer. If anything fails (a part, or the conditional
        completion a racing writer won), the upload is aborted: left open, its parts would stay in the
        bucket, unlisted and billed; closing fsspec's file after a failure would instead complete the
        upload with the parts sent so far."""
        fm = self._fm
        fm._count("multipart-put")
        self._buf.seek(0)
        out = fm.fs.open(self.path, "wb" if self.overwrite else "xb", block_size=_PART_BYTES)
        try:
            while chunk := self._buf.read(_PART_BYTES):
                killswitch.tick()  # each part sent is a change at the store (its parts persist)
                out.write(chunk)
            out.close()  # completes the upload (conditionally, with "xb")
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
            # best effort: the failure that stopped the upload is the one to report (and to retry); an
            # upload the abort missed is found and aborted by `backup prune` (pending_uploads)
            with contextlib.suppress(Exception):
                discard()
    finally:
        out.closed = True  # so neither close() nor the garbage collector completes it


class _RangeReader(io.RawIOBase):
    """One S3 object as ranged GETs, each retried on its own: a truncated block is fetched again,
    never returned short. The first reply tells the size and the ETag; later ranges ask for that ETag
    (If-Match), so an object replaced mid-read is an error, not a mix of two versions. No HEAD."""

    def __init__(self, fm: "DirectPutFileManager", path: str):
        super().__init__()
        self._fm, self._path = fm, path
        self._bucket, _, self._key = path.partition("/")
        self._pos = 0  # the next byte to fetch
        self._size: int | None = None
        self._etag: str | None = None
        self._block = memoryview(b"")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        """Seekable: a seek only moves where the next ranged GET starts (the ledger reads a record at an
        offset of its segment). Bytes already fetched are reused when the seek lands among them."""
        return True

    def tell(self) -> int:
        return self._pos - len(self._block)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self.tell() + offset
        elif whence == io.SEEK_END:
            if self._size is None:  # the first reply tells the size
                self._block = memoryview(self._fetch())
            target = self._size + offset
        else:
            raise ValueError(f"invalid whence ({whence})")
        if target < 0:
            raise OSError(errno.EINVAL, f"negative seek position {target}", self._fm.url(self._path))
        start = self._pos - len(self._block)
        if start <= target <= self._pos:
            self._block = self._block[target - start:]
        else:
            self._block = memoryview(b"")
            self._pos = target
        return target

    def readinto(self, b) -> int:
        if not self._block:
            if self._size is not None and self._pos >= self._size:
                return 0
            data = self._fetch()
            if not data:
                return 0
            self._block = memoryview(data)
        n = min(len(b), len(self._block))
        b[:n] = self._block[:n]
        self._block = self._block[n:]
        return n

    def _fetch(self) -> bytes:
        from fsspec.asyn import sync

        fm, start = self._fm, self._pos
        end = start + _READ_BLOCK if self._size is None else min(start + _READ_BLOCK, self._size)
        fm._count("get")
        data, size, etag = fm.retrier.call("GetObject", fm.url(self._path),
                                           lambda: sync(fm.fs.loop, self._get, start, end - 1))
        self._size = size
        self._etag = self._etag or etag
        self._pos += len(data)
        return data

    async def _get(self, first: int, last: int) -> tuple[bytes, int, str | None]:
        kw = {"Range": f"bytes={first}-{last}"}
        if self._etag:
            kw["IfMatch"] = self._etag
        try:
            resp = await self._fm.fs._call_s3("get_object", Bucket=self._bucket, Key=self._key, **kw)
        except OSError as e:
            answer = _http_answer(e)
            if answer and (answer[0] == "InvalidRange" or answer[1] == 416) and first == 0:
                return b"", 0, None  # an empty object has no byte 0
            if answer and (answer[0] == "PreconditionFailed" or answer[1] == 412):
                raise OSError(errno.ESTALE, "the object was replaced while it was being read",
                              self._fm.url(self._path)) from e
            raise
        try:
            data = await resp["Body"].read()
        finally:
            resp["Body"].close()
        content_range = resp.get("ContentRange") or ""
        size = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else len(data) + first
        return data, size, resp.get("ETag")


class DirectPutFileManager(CheckpointFileManager):
    """S3/GCS/Azure through fsspec: direct (conditional) put, batched deletes, one-LIST walks."""

    strategy = "direct-put"
    hadoop_crc = False  # S3A/GCS/ABFS connectors never read Hadoop .crc sidecars
    atomic_rename = False  # rename is copy + delete

    def __init__(self, location: Location, storage_options: dict):
        super().__init__(location)
        import fsspec

        opts = dict(storage_options)
        policy = RetryPolicy.resolve(opts.pop(RETRY_OPTION, None))
        opts.setdefault("skip_instance_cache", True)  # our own counters, our own cache
        if location.scheme == "s3":
            opts.setdefault("use_listings_cache", False)
            # One retry policy (ours): botocore's attempts off here, s3fs's below.
            config = dict(opts.get("config_kwargs") or {})
            config.setdefault("retries", {"mode": "standard", "total_max_attempts": 1})
            session_cls = _single_attempt_session_cls()
            if session_cls is not None:
                config.setdefault("http_session_cls", session_cls)
            opts["config_kwargs"] = config
        # whether each attempt of a request is sent exactly once (neither botocore nor aiohttp sends it
        # again): then a conditional PUT's first attempt answered 412 found someone else's object
        self._sends_once = (location.scheme == "s3" and session_cls is not None
                            and config.get("http_session_cls") is session_cls
                            and config.get("retries") == {"mode": "standard", "total_max_attempts": 1})
        self.fs = fsspec.filesystem(location.scheme, **opts)
        if location.scheme == "s3":
            self.fs.retries = 1
        else:  # gcsfs and adlfs retry inside; ours on top would multiply: report their failures only
            policy = RetryPolicy(max_attempts=1)
        endpoint = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
        self.retrier = Retrier(policy, self.counter, endpoint=str(endpoint) if endpoint else None)
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
        def get():
            self._count("get")
            return self.fs.cat_file(path, **self._cat_kwargs)

        return self.retrier.call("GetObject", self.url(path), get)

    @property
    def conditional_replace(self) -> bool:  # type: ignore[override]
        return self.location.scheme == "s3"

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        """One GET: the body and its ETag (S3; other stores: no version)."""
        if not self.conditional_replace:
            return super().read_versioned(path)
        from fsspec.asyn import sync

        bucket, _, key = path.partition("/")

        async def get() -> tuple[bytes, str | None]:
            self._count("get")
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            try:
                data = await resp["Body"].read()
            finally:
                resp["Body"].close()
            length = resp.get("ContentLength")
            if length is not None and len(data) != int(length):  # a short reply is never taken as the object
                raise ConnectionResetError(errno.ECONNRESET, "connection reset (truncated reply)")
            return data, resp.get("ETag")

        return self.retrier.call("GetObject", self.url(path), lambda: sync(self.fs.loop, get))

    def replace_if_same(self, path: str, data: bytes, version: str | None) -> None:
        """S3: one PUT with ``If-Match: version`` (manager docstring); a 412 or 404 is read back."""
        if not self.conditional_replace or version is None:
            return super().replace_if_same(path, data, version)
        from fsspec.asyn import sync

        bucket, _, key = path.partition("/")
        url = self.url(path)

        async def put() -> None:
            self._count("put")
            await self.fs._call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=version)

        killswitch.tick(what=path)
        try:
            self.retrier.call("PutObject", url, lambda: sync(self.fs.loop, put))
        except Exception as e:
            if not (_is_precondition_failed(e) or isinstance(e, FileNotFoundError)):
                raise
            try:  # an earlier attempt of this call may have been stored, its reply lost: then it is ours
                now = self.read_bytes(path)
            except FileNotFoundError:
                now = None
            if now != data:
                raise FileChangedError(errno.ESTALE, "replaced or deleted since it was read (conditional put "
                                       "refused)", url) from e
        finally:
            self.fs.invalidate_cache(path)

    def read_prefix(self, path: str, n: int) -> bytes:
        def get():
            self._count("get")
            return self.fs.cat_file(path, start=0, end=n)

        return self.retrier.call("GetObject", self.url(path), get)

    def open_read(self, path: str):
        if self.location.scheme == "s3":
            return io.BufferedReader(_RangeReader(self, path), buffer_size=2**20)
        self._count("get")
        return self.fs.open(path, "rb", block_size=_SINGLE_PUT_MAX, cache_type="readahead")

    def _holds(self, path: str, buf, size: int) -> bool:
        """Whether the object at ``path`` holds exactly the ``size`` bytes in ``buf``."""
        buf.seek(0)
        try:
            if size <= _SINGLE_PUT_MAX:
                return self.read_bytes(path) == buf.read()
            with self.open_read(path) as f:
                while True:
                    mine, theirs = buf.read(_PART_BYTES), f.read(_PART_BYTES)
                    if mine != theirs:
                        return False
                    if not mine:
                        return True
        except FileNotFoundError:
            return False

    def read_many(self, paths: Iterable[str], errors: dict | None = None) -> dict[str, bytes | None]:
        paths = list(paths)
        if not paths:
            return {}
        if not getattr(self.fs, "async_impl", False):
            return super().read_many(paths, errors)
        from fsspec.asyn import sync

        sem_holder: dict = {}

        async def get(p: str):
            self._count("get")
            return await self.fs._cat_file(p, **self._cat_kwargs)

        async def one(p: str):
            async with sem_holder["sem"]:
                try:
                    return p, await self.retrier.acall("GetObject", self.url(p), lambda: get(p))
                except FileNotFoundError:
                    return p, None
                except OSError as e:
                    if errors is None:
                        raise
                    errors[p] = e
                    return p, None

        async def run():
            sem_holder["sem"] = asyncio.Semaphore(_READ_CONCURRENCY)
            return await _gather_or_cancel(one(p) for p in paths)

        return dict(sync(self.fs.loop, run))

    def info(self, path: str) -> FileInfo | None:
        if self.location.scheme == "s3":  # one HEAD (s3fs's info LISTs after a 404, in the same attempt)
            from fsspec.asyn import sync

            if not path.partition("/")[2]:
                return None  # a bucket is no file
            resp = sync(self.fs.loop, self._s3_head, path, True)
            if resp is None:
                return None
            mtime = resp.get("LastModified")
            return FileInfo(path, int(resp.get("ContentLength") or 0),
                            mtime.timestamp() if hasattr(mtime, "timestamp") else None)

        def head():
            self._count("head")
            return self.fs.info(path)

        try:
            d = self.retrier.call("HeadObject", self.url(path), head)
        except FileNotFoundError:
            return None
        if d.get("type") == "directory":
            return None
        return _fileinfo(d)

    def exists(self, path: str) -> bool:
        return self.info(path) is not None

    def list(self, path: str) -> list[FileInfo]:
        if self.location.scheme == "s3":
            return self._s3_list(path)

        def ls():  # a failed page starts the listing over: nothing repeated, nothing skipped
            self._count("list")
            return self.fs.ls(path, detail=True, refresh=True)

        try:
            return [_fileinfo(d) for d in self.retrier.call("ListObjectsV2", self.url(path), ls)]
        except FileNotFoundError:
            return []

    def any_under(self, path: str) -> bool:
        if self.location.scheme != "s3":
            return super().any_under(path)
        bucket, _, key = path.strip("/").partition("/")
        pages = self._s3_pages("list_objects_v2", self.url(path),
                               {"Bucket": bucket, "Prefix": f"{key}/" if key else "", "MaxKeys": 1})
        try:
            return bool(next(pages).get("KeyCount", 0))  # one page of at most one key
        except FileNotFoundError:  # no such bucket
            return False
        finally:
            pages.close()

    def walk(self, path: str, empty_dirs: bool = False) -> list[FileInfo]:
        if self.location.scheme == "s3":
            return self._s3_walk(path, empty_dirs)

        def find():
            self._count("list")
            return self.fs.find(path.rstrip("/") + "/", detail=True)

        try:
            found = self.retrier.call("ListObjectsV2", self.url(path), find)
        except FileNotFoundError:
            return []
        return [_fileinfo(d) for d in found.values() if d.get("type") != "directory"]

    def _s3_list(self, path: str) -> list[FileInfo]:
        """The direct children of ``path`` (``Delimiter=/``), sorted. Not s3fs's ``ls``: when a directory
        lists empty, that lists the parent too (for a file of that name) and swallows its failure."""
        return sorted(self._s3_objects(path, children_only=True), key=lambda f: f.path)

    def _s3_walk(self, path: str, empty_dirs: bool = False) -> list[FileInfo]:
        """Exactly one ListObjectsV2 per 1,000 keys, and nothing else (no existence probes)."""
        return self._s3_objects(path, children_only=False, empty_dirs=empty_dirs)

    def _s3_objects(self, path: str, children_only: bool, empty_dirs: bool = False) -> list[FileInfo]:
        """The objects below ``path`` (its direct children with ``children_only``). A key ending in ``/`` is a
        directory marker, no file: what S3A's ``mkdirs`` leaves (Hadoop 3.4 keeps them by default), and the
        console's "create folder". S3A lists one as the directory it marks, and never the listed directory's
        own: so here, as the local walk reports directories, a marker of a directory with nothing else below
        it is an empty directory where ``empty_dirs`` asks for them, and otherwise not listed."""
        bucket, _, key = path.strip("/").partition("/")
        kwargs = {"Bucket": bucket, "Prefix": f"{key}/" if key else ""}
        if children_only:
            kwargs["Delimiter"] = "/"
        out, markers = [], []
        for resp in self._s3_pages("list_objects_v2", self.url(path), kwargs):
            for o in resp.get("Contents", []):
                if o["Key"].endswith("/"):
                    if o["Key"] != kwargs["Prefix"]:  # the listed directory's own: never listed
                        markers.append(o["Key"])
                    continue
                mtime = o.get("LastModified")
                out.append(FileInfo(f"{bucket}/{o['Key']}", int(o.get("Size", 0)),
                                    mtime.timestamp() if hasattr(mtime, "timestamp") else None))
            for d in resp.get("CommonPrefixes", []):
                out.append(FileInfo(f"{bucket}/{d['Prefix'].rstrip('/')}", 0, None, is_dir=True))
        if empty_dirs and markers and not children_only:  # (a child's marker comes as its CommonPrefix)
            filled = set()  # every directory with a file, or another marker, below it
            for rel in [f.path[len(bucket) + 1:] for f in out] + [m.rstrip("/") for m in markers]:
                parent = rel.rpartition("/")[0]
                while parent and parent not in filled:
                    filled.add(parent)
                    parent = parent.rpartition("/")[0]
            out += [FileInfo(f"{bucket}/{m.rstrip('/')}", 0, None, is_dir=True)
                    for m in markers if m.rstrip("/") not in filled]
        return out

    def _s3_pages(self, method: str, url: str, kwargs: dict) -> Iterator[dict]:
        """Each page of a paged S3 listing (``method``: a key of ``_PAGED``), each its own request
        through the retry policy: a page that fails is asked for again with the same markers."""
        kind, counted_as, markers = _PAGED[method]
        kwargs = dict(kwargs)
        while True:
            def page(kw=dict(kwargs)):
                self._count(counted_as)
                return self.fs.call_s3(method, **kw)

            resp = self.retrier.call(kind, url, page)
            yield resp
            if not resp.get("IsTruncated"):
                return
            kwargs.update({param: resp.get(field) for param, field in markers})

    def delete_many(self, paths: Iterable[str]) -> None:
        paths = list(dict.fromkeys(paths))
        if not paths:
            return
        if self.location.scheme != "s3":
            for p in paths:
                def rm(p=p):
                    self._count("delete")
                    self.fs.rm_file(p)

                try:
                    self.retrier.call("DeleteObject", self.url(p), rm)
                except FileNotFoundError:
                    pass
            return
        by_bucket: dict[str, list[str]] = {}
        for p in paths:
            bucket, _, key = p.partition("/")
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), _S3_DELETE_BATCH):
                self._s3_delete_objects(bucket, [{"Key": k} for k in keys[i : i + _S3_DELETE_BATCH]], _GONE)
        for p in paths:
            self.fs.invalidate_cache(p)

    def _s3_delete_objects(self, bucket: str, objects: list[dict], gone: frozenset[str]) -> None:
        """One DeleteObjects of ``objects`` (``{"Key": ...}``, with a ``VersionId`` to remove that
        version), through the retry policy. A ``200 OK`` reply may name keys that failed: the keys
        whose codes are transient are sent again, alone; a code in ``gone`` (already deleted) is done;
        any other code is an answer (module docstring)."""
        pending = list(objects)
        url = self.url(f"{bucket}/{pending[0]['Key']}")

        def attempt() -> None:
            self._count("delete-batch")
            resp = self.fs.call_s3("delete_objects", Bucket=bucket, Delete={"Objects": pending, "Quiet": True})
            failed = [e for e in resp.get("Errors", []) if e.get("Code") not in gone]
            answers = [e for e in failed if not transient_code(str(e.get("Code", "")))]
            if answers:
                raise _key_answer(self.url(f"{bucket}/{answers[0].get('Key')}"), answers)
            failed_keys = {e.get("Key") for e in failed}
            pending[:] = [o for o in pending if o["Key"] in failed_keys]
            if pending:
                raise _KeyErrors(url, failed)

        self.retrier.call("DeleteObjects", url, attempt)

    def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        if not overwrite and self.exists(dst):
            raise FileExistsError(errno.EEXIST, "file exists", dst)
        self.copy(src, dst)
        self.delete_many([src])

    def copy(self, src: str, dst: str) -> None:
        if self.location.scheme == "s3":
            from fsspec.asyn import sync

            sync(self.fs.loop, self._s3_copy, src, dst)
            return

        def cp():  # gcsfs/adlfs retry inside; our policy is one attempt there (__init__)
            self._count("copy")
            self.fs.copy(src, dst)

        self.retrier.call("CopyObject", self.url(src), cp)
        self.fs.invalidate_cache(dst)

    async def _s3_copy(self, src: str, dst: str) -> None:
        """One CopyObject, retried on its own (no LIST, no HEAD: s3fs's ``copy`` expands paths and HEADs
        first, and a unit of four requests fails four times as often). A source S3 refuses to copy whole
        (over 5 GiB) is copied in parts (``_s3_copy_parts``)."""
        src_bucket, _, src_key = src.partition("/")
        bucket, _, key = dst.partition("/")

        async def copy_object() -> None:
            self._count("copy")
            await self.fs._call_s3("copy_object", Bucket=bucket, Key=key,
                                   CopySource={"Bucket": src_bucket, "Key": src_key})

        try:
            await self.retrier.acall("CopyObject", self.url(src), copy_object)
        except OSError as e:
            if not _copy_source_too_large(e):
                raise
            await self._s3_copy_parts(src, dst)
        finally:
            self.fs.invalidate_cache(dst)

    async def _s3_copy_parts(self, src: str, dst: str) -> None:
        """A multipart copy, as S3 requires for a source over 5 GiB: a HEAD (the source's size and ETag),
        CreateMultipartUpload, one UploadPartCopy per range of the source (pinned to that ETag: a source
        replaced meanwhile is an error, never a mix), CompleteMultipartUpload. Each request is retried on
        its own: a part copied again replaces itself; a completion whose reply was lost is answered
        ``NoSuchUpload`` on its retry, and is done if ``dst`` now has the source's size. If anything fails
        the upload is aborted (an upload the abort misses is found by ``pending_uploads``)."""
        src_bucket, _, src_key = src.partition("/")
        bucket, _, key = dst.partition("/")
        url = self.url(dst)
        head = await self._s3_head(src)
        size, etag = int(head["ContentLength"]), head.get("ETag")
        part_bytes = max(_COPY_PART_BYTES, -(-size // _MAX_PARTS))

        async def create() -> dict:
            self._count("multipart-start")
            return await self.fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key)

        upload_id = (await self.retrier.acall("CreateMultipartUpload", url, create))["UploadId"]
        try:
            parts = []
            for number, first in enumerate(range(0, max(size, 1), part_bytes), start=1):
                last = min(first + part_bytes, size) - 1
                source = {"CopySource": {"Bucket": src_bucket, "Key": src_key}, **({"CopySourceIfMatch": etag}
                                                                                   if etag else {})}
                if size:
                    source["CopySourceRange"] = f"bytes={first}-{last}"

                async def copy_part(number=number, source=source) -> dict:
                    self._count("copy-part")
                    return await self.fs._call_s3("upload_part_copy", Bucket=bucket, Key=key, UploadId=upload_id,
                                                  PartNumber=number, **source)

                killswitch.tick()  # each part copied is a change at the store (its parts persist)
                resp = await self.retrier.acall("UploadPartCopy", url, copy_part)
                parts.append({"PartNumber": number, "ETag": resp["CopyPartResult"]["ETag"]})

            async def complete() -> None:
                self._count("multipart-complete")
                await self.fs._call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                                       MultipartUpload={"Parts": parts})

            try:
                await self.retrier.acall("CompleteMultipartUpload", url, complete)
            except FileNotFoundError:  # NoSuchUpload: completed by an attempt whose reply was lost?
                done = await self._s3_head(dst, missing_ok=True)
                if done is None or int(done["ContentLength"]) != size:
                    raise
        except BaseException:
            async def abort() -> None:
                self._count("abort-upload")
                await self.fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)

            # best effort: the failure that stopped the copy is the one to report
            with contextlib.suppress(Exception):
                await self.retrier.acall("AbortMultipartUpload", url, abort)
            raise

    async def _s3_head(self, path: str, missing_ok: bool = False) -> dict | None:
        """One HeadObject, retried on its own; None for a missing object when ``missing_ok``."""
        bucket, _, key = path.partition("/")

        async def head() -> dict:
            self._count("head")
            return await self.fs._call_s3("head_object", Bucket=bucket, Key=key)

        try:
            return await self.retrier.acall("HeadObject", self.url(path), head)
        except FileNotFoundError:
            if missing_ok:
                return None
            raise

    def mkdirs(self, path: str) -> None:
        pass  # object stores have no directories

    MARKER_LISTINGS = 8

    def remove_dirs_if_empty(self, paths: Iterable[str]) -> None:
        """On S3, the directory markers (``state/0/3/``: S3A's, the console's) of these directories that hold
        nothing else, deepest first: S3A lists such a marker as an empty directory, and an empty directory under
        ``state/`` stops a new query. One listing per directory not below another of them; nothing else is
        written (the store has no directories of its own): beyond ``MARKER_LISTINGS`` such directories (a sink's
        partition directories), one listing of the directory they share."""
        if self.location.scheme != "s3":
            return
        import bisect

        wanted = {p.strip("/") for p in paths}
        tops = []
        for p in wanted:
            up = p.rpartition("/")[0]
            while up and up not in wanted:
                up = up.rpartition("/")[0]
            if not up:
                tops.append(p)
        if len(tops) > self.MARKER_LISTINGS:  # one paged listing of what they share, not a round trip each
            shared = tops[0]
            for top in tops[1:]:
                while shared and not (top == shared or top.startswith(shared + "/")):
                    shared = shared.rpartition("/")[0]
            tops = [shared] if "/" in shared else tops  # (never a whole bucket)
        gone = []
        for top in sorted(tops):
            bucket, _, key = top.partition("/")
            keys = sorted(o["Key"] for resp in self._s3_pages("list_objects_v2", self.url(top),
                                                               {"Bucket": bucket, "Prefix": f"{key}/"})
                          for o in resp.get("Contents", []))
            removed: set[str] = set()
            for marker in sorted((k for k in keys if k.endswith("/") and f"{bucket}/{k[:-1]}" in wanted),
                                 key=lambda k: -k.count("/")):
                at = bisect.bisect_left(keys, marker)
                below = keys[at + 1:bisect.bisect_left(keys, marker[:-1] + "0", at)]  # "0" sorts right after "/"
                if all(k in removed for k in below):
                    removed.add(marker)
            gone += [f"{bucket}/{k}" for k in removed]
        self.delete_many(gone)

    def move_many(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Server-side copies (concurrently; on S3 each one CopyObject retried on its own, ``_s3_copy``),
        then batched deletes."""
        if not pairs:
            return []
        from fsspec.asyn import sync

        missing: list[str] = []
        sem_holder: dict = {}

        async def managed(src: str, dst: str):
            self._count("copy")
            await self.fs._cp_file(src, dst)

        async def one(src: str, dst: str):
            async with sem_holder["sem"]:
                try:
                    if self.location.scheme == "s3":
                        await self._s3_copy(src, dst)  # each request retried on its own
                    else:  # gcsfs/adlfs retry inside; our policy is one attempt there (__init__)
                        await self.retrier.acall("CopyObject", self.url(src), lambda: managed(src, dst))
                except FileNotFoundError:
                    missing.append(src)

        async def run():
            sem_holder["sem"] = asyncio.Semaphore(_READ_CONCURRENCY)
            await _gather_or_cancel(one(s, d) for s, d in pairs)

        sync(self.fs.loop, run)
        gone = set(missing)
        self.delete_many([s for s, _ in pairs if s not in gone])
        return missing

    def pending_uploads(self, path: str) -> list[PendingUpload]:
        """S3's incomplete multipart uploads below ``path`` (ListMultipartUploads, paginated)."""
        if self.location.scheme != "s3":
            return []
        bucket, _, key = path.strip("/").partition("/")
        out = []
        for resp in self._s3_pages("list_multipart_uploads", self.url(path),
                                   {"Bucket": bucket, "Prefix": f"{key}/" if key else ""}):
            for u in resp.get("Uploads", []):
                started = u.get("Initiated")
                out.append(PendingUpload(f"{bucket}/{u['Key']}", u["UploadId"],
                                         started.timestamp() if hasattr(started, "timestamp") else None))
        return out

    def abort_uploads(self, uploads: list[PendingUpload]) -> None:
        """Abort each upload, each request through the retry policy. An upload already gone (aborted or
        completed, by us or by a retried abort whose first reply was lost) is done: NoSuchUpload."""
        for u in uploads:
            if self.location.scheme != "s3":
                raise NotImplementedError(f"{self.location.scheme} uploads cannot be aborted here")
            bucket, _, key = u.path.partition("/")

            def abort(key=key, upload_id=u.upload_id):
                self._count("abort-upload")
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)

            try:
                self.retrier.call("AbortMultipartUpload", self.url(u.path), abort)
            except FileNotFoundError:
                pass  # already aborted or completed (s3fs maps NoSuchUpload to FileNotFoundError)
            except StoreUnavailableError:
                raise
            except Exception as e:
                if "NoSuchUpload" not in f"{type(e).__name__} {e}":
                    raise

    def versioning_enabled(self, path: str) -> bool:
        if self.location.scheme != "s3":
            return False
        bucket = path.split("/", 1)[0]

        def get():
            self._count("get-versioning")
            return self.fs.call_s3("get_bucket_versioning", Bucket=bucket)

        resp = self.retrier.call("GetBucketVersioning", f"s3://{bucket}", get)
        return resp.get("Status") == "Enabled"

    def undelete_many(self, paths: list[str]) -> list[str]:
        """Make the newest real version of each path current again, and return the paths that are
        still missing afterwards (no version to bring back, or markers that would not go).

        Every delete marker above that version goes, not only the newest: a delete retried after its
        reply was lost left one marker per attempt. Each round lists the versions below the paths'
        common prefix and removes, for each path whose latest entry is a marker, that marker and every
        marker newer than its newest version (by the store's clock; ties wait for the next round, whose
        listing says which is latest). The listing that finds nothing left to remove is the check."""
        if self.location.scheme != "s3":
            return super().undelete_many(paths)
        by_bucket: dict[str, set[str]] = {}
        for p in paths:
            b, _, k = p.partition("/")
            by_bucket.setdefault(b, set()).add(k)
        not_restored = []
        for bucket, keys in by_bucket.items():
            prefix = _common_prefix(sorted(keys))
            rounds = 0
            while True:
                history = self._key_histories(bucket, prefix, keys)
                markers = sorted((key, marker) for key, h in history.items() for marker in h.markers_above())
                if not markers or rounds == _UNDELETE_ROUNDS:
                    break
                for i in range(0, len(markers), _S3_DELETE_BATCH):
                    batch = markers[i : i + _S3_DELETE_BATCH]
                    # a retried batch finds the markers its lost first attempt removed already gone
                    self._s3_delete_objects(bucket, [{"Key": k, "VersionId": v} for k, v in batch], _GONE_VERSION)
                rounds += 1
            not_restored += [f"{bucket}/{k}" for k in sorted(keys) if k not in history or not history[k].current]
            for k in keys:
                self.fs.invalidate_cache(f"{bucket}/{k}")
        return not_restored

    def _key_histories(self, bucket: str, prefix: str, keys: set[str]) -> dict[str, "_KeyHistory"]:
        """The versions and delete markers of ``keys`` (ListObjectVersions below ``prefix``, paged)."""
        history: dict[str, _KeyHistory] = {}
        listing = {"Bucket": bucket, "Prefix": prefix}
        for resp in self._s3_pages("list_object_versions", f"s3://{bucket}/{prefix}", listing):
            for entries, is_marker in ((resp.get("Versions", []), False), (resp.get("DeleteMarkers", []), True)):
                for entry in entries:
                    if entry["Key"] in keys:
                        history.setdefault(entry["Key"], _KeyHistory()).add(entry, is_marker)
        return history


class _KeyHistory:
    """What ListObjectVersions says of one key: its delete markers, its newest real version."""

    __slots__ = ("markers", "latest_marker", "newest_version", "has_version", "current")

    def __init__(self):
        self.markers: list[tuple[str, float | None]] = []  # (version id, LastModified)
        self.latest_marker: str | None = None
        self.newest_version: float | None = None  # LastModified of the newest real version
        self.has_version = False
        self.current = False  # the latest entry is a real version: the key exists

    def add(self, entry: dict, is_marker: bool) -> None:
        modified = entry.get("LastModified")
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else None
        if is_marker:
            self.markers.append((entry["VersionId"], stamp))
            if entry.get("IsLatest"):
                self.latest_marker = entry["VersionId"]
            return
        self.has_version = True
        self.current = self.current or bool(entry.get("IsLatest"))
        if stamp is not None and (self.newest_version is None or stamp > self.newest_version):
            self.newest_version = stamp

    def markers_above(self) -> list[str]:
        """The markers to remove so the newest real version becomes current: none if it is current
        or there is none; else the latest marker and every marker newer than that version."""
        if self.current or not self.has_version or self.latest_marker is None:
            return []
        return [marker for marker, stamp in self.markers if marker == self.latest_marker
                or (stamp is not None and self.newest_version is not None and stamp > self.newest_version)]


class _KeyErrors(OSError):
    """Keys a ``200 OK`` multi-object delete failed with transient per-key codes (``SlowDown``,
    ``InternalError``...): shaped like a client error (``response``), so the retry policy retries it."""

    def __init__(self, url: str, errors: list[dict]):
        code = str(errors[0].get("Code", ""))
        super().__init__(errno.EIO, f"{len(errors)} key(s) of a batch delete failed ({code}: "
                                    f"{errors[0].get('Message')}), e.g. {errors[0].get('Key')}", url)
        self.response = {"Error": {"Code": code, "Message": errors[0].get("Message")}, "ResponseMetadata": {}}


def _key_answer(url: str, errors: list[dict]) -> OSError:
    """The per-key answer of a multi-object delete that retrying will not change: denied or else."""
    code = str(errors[0].get("Code", ""))
    message = f"{len(errors)} key(s) of a batch delete refused: {code} {errors[0].get('Message')}"
    if code in ("AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return PermissionError(errno.EACCES, message, url)
    return OSError(errno.EIO, message, url)


_SESSION_CLS: list = []


def _single_attempt_session_cls():
    """aiobotocore's HTTP session with aiohttp's own resend turned off: aiohttp sends an idempotent
    request (GET, HEAD, PUT, DELETE) again, once, when the reused connection it went out on turns out
    dead. RFC 9112 allows it, but it is a retry nothing above it sees or counts (and a conditional PUT
    resent that way comes back 412). None if this aiobotocore has no hook for it: then that one resend
    stays, and the 412 check still holds."""
    if not _SESSION_CLS:
        try:
            from aiobotocore.httpsession import AIOHTTPSession
        except ImportError:  # pragma: no cover - s3fs always brings aiobotocore
            AIOHTTPSession = None
        cls = None
        if AIOHTTPSession is not None and hasattr(AIOHTTPSession, "_get_session"):
            class SingleAttemptSession(AIOHTTPSession):
                async def _get_session(self, proxy_url):
                    session = await super()._get_session(proxy_url)
                    session._retry_connection = False
                    return session

            cls = SingleAttemptSession
        _SESSION_CLS.append(cls)
    return _SESSION_CLS[0]


async def _gather_or_cancel(coros) -> list:
    """``asyncio.gather`` that cancels the others when one fails (an exhausted retry stops the batch
    instead of leaving requests running behind the error)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _common_prefix(keys: list[str]) -> str:
    if not keys:
        return ""
    a, b = keys[0], keys[-1]
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
