"""Errors every operation raises, each naming the file, what is wrong and what to do."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

# Exit codes shared by every CLI command.
EXIT_OK = 0
EXIT_FINDINGS = 1  # fsck found problems, or an operation was refused
EXIT_BAD_INPUT = 2  # the input cannot be used at all


class CheckpointOpsError(Exception):
    """Base error: carries the path, the problem and a concrete next step."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problem: str, *, path: str | None = None, fix: str | None = None):
        self.problem = problem
        self.path = path
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.path}: {self.problem}" if self.path else self.problem
        return f"{head}\n  fix: {self.fix}" if self.fix else head

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "path": self.path, "problem": self.problem, "fix": self.fix}


def problem_of(error: BaseException) -> str:
    """What went wrong, for a message that wraps ``error``: our own error's problem (its path and fix are said by
    the wrapper), else the exception's type and text."""
    return error.problem if isinstance(error, CheckpointOpsError) else f"{type(error).__name__}: {error}"


class BadInputError(CheckpointOpsError):
    """The input is unusable: not a checkpoint, unreadable, malformed."""


class UnsupportedVersionError(BadInputError):
    """A file uses a format version newer than this tool understands."""


class StorageError(BadInputError):
    """The storage backend failed or is misconfigured."""


class StoreUnavailableError(CheckpointOpsError):
    """The object store kept failing one request through every attempt the retry policy allows
    (throttling, 5xx replies, dropped connections, truncated replies): nothing about the input is
    wrong, and nothing half-done is visible. ``fix`` says how to finish; an operation that stopped
    after journaling replaces it with the command that finishes it (``finish_with``).

    Deliberately not a ``BadInputError`` (nor a ``StorageError``): a handler for damaged or unusable input
    (``except BadInputError``: "unreadable, so absent", "damaged, so named") never takes an outage for what
    it judges, and a store that does not answer never passes or fails a check. Code that means "the store
    failed or refused, whichever" catches ``STORE_FAILURES``."""

    exit_code = EXIT_BAD_INPUT  # 2, as a command the input stops: it did not do what was asked
    DEFAULT_FIX = "nothing was changed; run the same command again once the store answers"

    def __init__(self, problem: str, *, path: str | None = None, fix: str | None = None,
                 retries: dict[str, int] | None = None):
        super().__init__(problem, path=path, fix=fix or self.DEFAULT_FIX)
        self.retries = dict(retries or {})  # what the failing store's requests were retried, by kind

    def finish_with(self, fix: str) -> "StoreUnavailableError":
        """The same failure, with what to do now that it stopped an operation part-way."""
        e = StoreUnavailableError(self.problem, path=self.path, fix=fix, retries=self.retries)
        e.__cause__ = self.__cause__
        return e

    def to_dict(self) -> dict:
        return {**super().to_dict(), "retries": self.retries}


# "The store failed (``StoreUnavailableError``) or refused / is misconfigured (``StorageError``)": for best-effort
# work that any failure of the store only postpones, and for a caller that answers both the same way.
STORE_FAILURES: tuple[type[CheckpointOpsError], ...] = (StorageError, StoreUnavailableError)


def is_storage_failure(e: BaseException) -> bool:
    """A failure of the storage below us that is not one of our errors: the OS's (permission denied, disk
    full) or an object-store client's (no credentials, access denied, no such bucket, endpoint unreachable)."""
    if isinstance(e, CheckpointOpsError):
        return False
    return isinstance(e, OSError) or type(e).__module__.split(".")[0] in (
        "botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "aiohttp")


def store_kept_failing(e: BaseException) -> bool:
    """A failure of the storage below us, raw (``is_storage_failure``) or ours once the store kept failing through
    every retry (``StoreUnavailableError``): what a cleanup on the way out (a release, a scratch removal) lets go,
    so that it never replaces the outcome of what it cleans up after."""
    return isinstance(e, StoreUnavailableError) or is_storage_failure(e)


class RefusedError(CheckpointOpsError):
    """The operation is possible in principle but refused for safety (exit 1)."""

    exit_code = EXIT_FINDINGS


# ---- naming parameters in messages ----------------------------------------------------------------
# A message that names a parameter says it the way the front end in use spells it: a flag on the command
# line (the default), a run-config key in the Dagster layer, which sets its own names around its calls.
_PARAMETER_NAMES: ContextVar[dict[str, str | None]] = ContextVar("parameter_names", default={})


def param(key: str) -> str | None:
    """``--to-batch`` for ``to_batch`` on the command line; what the front end in use calls it otherwise
    (None: that front end has no such parameter, and the message leaves the hint out)."""
    names = _PARAMETER_NAMES.get()
    if key in names:
        return names[key]
    return "--" + key.replace("_", "-")


@contextlib.contextmanager
def parameter_names(names: dict[str, str | None]):
    """Within this block, messages name parameters as ``names`` says (key -> name, None: no such)."""
    token = _PARAMETER_NAMES.set({**_PARAMETER_NAMES.get(), **names})
    try:
        yield
    finally:
        _PARAMETER_NAMES.reset(token)


def require_batch_number(batch: int, key: str, path: str | None = None) -> int:
    """``batch`` as given for parameter ``key`` (``param`` names it), refused when negative: Spark numbers
    batches from 0, so a negative one names no file and is a typing slip, never "nothing" or "unknown"."""
    if batch < 0:
        raise BadInputError(f"{param(key)} must be >= 0 (got {batch})", path=path,
                            fix="Spark numbers batches from 0 (`checkpoint-ops inspect` lists them)")
    return batch
