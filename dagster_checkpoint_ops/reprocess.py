"""Reprocessing requests dropped as files: ``<home>/reprocess-requests/<name>.json`` becomes a run.

A request is a regular file of at most 4 KB holding ``{"asset": "<name>", "to_batch": N}`` or
``{"asset": "<name>", "to_time": "<ISO 8601>"}``, with an optional ``"id"`` (default: the file name without
``.json``). An id is at most 128 characters of ``A-Z a-z 0-9 . _ : -``. Each request becomes one
rollback-and-reprocess run of that asset with ``run_key`` = ``<asset>:<id>``: the same id may name requests
for two assets, and one asset and id never run twice (a second file with them is served by the same run).

What the sensor does with each name in the folder, judged without following links
(``request_folder.py``):

* a request stays where it is while its run is asked for, queued or running. When the run has ended the
  request moves to ``handled/`` (the run succeeded) or ``failed/`` (it failed or was canceled), with a note
  ``<name>.reason.txt`` beside it saying which run, how it ended and, on failure, why (the failure event's
  message and the step's error: e.g. the rollback's refusal);
* a malformed request, one for an unknown asset, one with a bad id, one bigger than 4 KB (not read), a
  symbolic link named ``*.json`` (the link is moved, never followed) and a file named ``*.JSON`` (any case
  but ``.json``) move to ``rejected/`` with the reason in the note;
* anything else (directories, even one named ``x.json``; other file names; hidden names; FIFOs and other
  special files) is left alone and reported once, in the log and the skip reason.

``handled/``, ``failed/`` and ``rejected/`` must be real directories: if one is a symbolic link (or a
file), it is reported and nothing moves there until it is fixed; those requests wait. Notes are never
written through a link nor over an existing name. Nothing is deleted.

How the sensor learns a run's outcome: it looks the run up by its run key (``instance.get_run_records``)
on every evaluation while the request is in the folder, and reads the run's failure event when it
failed. A request is moved exactly once: the move is a single no-replace rename, published after its
note, and an interrupted move is finished by the next evaluation (``request_folder.py``).

The cursor stays small and bounded: digests of the run keys asked for whose runs do not exist yet, and
digests of what has been reported (so each problem is reported once), each at most ``MAX_REMEMBERED``
and only for names still in the folder.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Optional, Union

import dagster as dg

from dagster_checkpoint_ops.query import StreamingQuery, job_name
from dagster_checkpoint_ops.request_folder import (FAILED, HANDLED, LEAVE, MAX_NOTE_BYTES, OWN, REJECT,
                                      REJECTED, REQUEST_SUFFIX, Entry, EntryChangedError, RequestFolder,
                                      RequestFolderError, UnreadableRequestError, UnsafeFolderError, shown)
from dagster_checkpoint_ops.resources.settings import StreamingSettings

RUN_KEY_TAG = "dagster/run_key"
QUERY_TAG = "checkpoint/query"
REQUEST_TAG = "reprocess/request"
ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ID_RULE = "at most 128 characters of A-Z a-z 0-9 . _ : -"
MAX_BATCH_ID = 2**63 - 1  # Spark's batch ids are Java longs
MAX_TIME_CHARS = 64
MAX_REMEMBERED = 1000  # digests of asked run keys, and of reported problems, kept in the cursor
MAX_SHOWN = 80  # characters of a bad value quoted in a reason
MAX_LINE = 400  # characters of one line of the log or the skip reason
MAX_SKIP_REASON = 4000
FIELDS = ("asset", "to_batch", "to_time", "id")


class RequestError(ValueError):
    """A request file that is not a valid request; the message is the reason written beside it."""


def _quoted(value) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text)} characters)"


def _one_line(text: str, limit: int = MAX_LINE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class ReprocessRequest:
    """One valid request: which asset to roll back to where, under which id."""

    asset: str
    id: str
    to_batch: Optional[int] = None
    to_time: Optional[str] = None

    @property
    def run_key(self) -> str:
        return f"{self.asset}:{self.id}"

    @property
    def op_config(self) -> dict:
        """The streaming asset's run config (``ReprocessConfig``) for this request."""
        if self.to_batch is not None:
            return {"rollback_to_batch": self.to_batch}
        return {"rollback_to_time": self.to_time}

    def to_dict(self) -> dict:
        target = {"to_batch": self.to_batch} if self.to_batch is not None else {"to_time": self.to_time}
        return {"asset": self.asset, **target, "id": self.id}


def _no_duplicate_fields(pairs: list) -> dict:
    doc: dict = {}
    for key, value in pairs:
        if key in doc:
            raise RequestError(f"field {_quoted(key)} appears twice: give each field once")
        doc[key] = value
    return doc


def parse_request(data: bytes, default_id: str, names: set[str]) -> ReprocessRequest:
    """The request in ``data`` (a file's bytes); ``default_id`` is its file name without ``.json``.

    Raises RequestError saying what is wrong and what a request looks like.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicate_fields)
    except RequestError:
        raise
    except ValueError as e:
        raise RequestError(f"not valid JSON ({_one_line(str(e), 200)})") from None
    if not isinstance(doc, dict):
        raise RequestError('not a JSON object like {"asset": "<name>", "to_batch": 12, "id": "INC-4711"}')
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {_quoted(unknown)} (allowed: {', '.join(FIELDS)})")
    asset = doc.get("asset")
    if not isinstance(asset, str) or asset not in names:
        raise RequestError(f'unknown asset {_quoted(asset)} in "asset" (request files serve the streaming assets of '
                           f'streaming_definitions here: {", ".join(sorted(names))}; a StreamingQueryComponent\'s '
                           'query is reprocessed from its job instead: launch <name>_job with the run config '
                           'rollback_to_batch or rollback_to_time)')
    if ("to_batch" in doc) == ("to_time" in doc):
        raise RequestError('give exactly one of "to_batch" (a batch id) and "to_time" (an ISO 8601 time)')
    to_batch = to_time = None
    if "to_batch" in doc:
        to_batch = doc["to_batch"]
        if not isinstance(to_batch, int) or isinstance(to_batch, bool) or not 0 <= to_batch <= MAX_BATCH_ID:
            raise RequestError(f'"to_batch" must be a batch id (a non-negative integer below 2^63), not '
                               f'{_quoted(to_batch)}')
    else:
        to_time = doc["to_time"]
        try:
            if not isinstance(to_time, str) or len(to_time) > MAX_TIME_CHARS:
                raise ValueError
            datetime.fromisoformat(to_time)
        except ValueError:
            raise RequestError(f'"to_time" {_quoted(to_time)} is not an ISO 8601 time (e.g. 2026-11-21T06:30:00Z)') \
                from None
    if "id" in doc:
        request_id = doc["id"]
        if not isinstance(request_id, str) or not ID_PATTERN.fullmatch(request_id):
            raise RequestError(f'"id" must be {ID_RULE}, not {_quoted(request_id)}')
    else:
        request_id = default_id
        if not ID_PATTERN.fullmatch(request_id):
            raise RequestError(f"no \"id\", and the file name {_quoted(request_id)} is not one (an id is {ID_RULE}): "
                               'give an "id" or rename the file')
    return ReprocessRequest(asset=asset, id=request_id, to_batch=to_batch, to_time=to_time)


# ---- runs -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """A request's run as the instance knows it: status and, once it failed, why."""

    run_id: str
    job_name: str
    run_key: str
    status: str  # a DagsterRunStatus value
    finished: bool
    succeeded: bool
    reason: str  # why it failed: the first failed step's error, else the failure event's; "" otherwise
    failure_event: str  # the run's failure (or cancellation) event message; "" unless it failed
    requested_by: str  # the request file the run was asked for
    op_config: dict  # the config the run was given

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "job_name": self.job_name, "run_key": self.run_key, "status": self.status,
                "finished": self.finished, "succeeded": self.succeeded, "reason": self.reason,
                "failure_event": self.failure_event,
                "requested_by": self.requested_by, "op_config": self.op_config}


def _failure(instance: dg.DagsterInstance, run: dg.DagsterRun) -> tuple[str, str]:
    """(reason, event message) of the run's failure (or cancellation) event; the reason is the first failed
    step's error (e.g. the rollback's refusal), else the run's own error, else the event's message."""
    records = instance.get_records_for_run(
        run.run_id, of_type={dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED},
        ascending=False, limit=1).records
    event = records[0].event_log_entry.dagster_event if records else None
    if event is None:
        return f"the run ended {run.status.value}; it recorded no failure event", ""
    data = event.event_specific_data
    step = getattr(data, "first_step_failure_event", None)
    detail = ""
    if step is not None:
        failure = step.step_failure_data
        detail = failure.user_failure_data.description if failure.user_failure_data and \
            failure.user_failure_data.description else (failure.error.message if failure.error else "")
    elif getattr(data, "error", None) is not None:
        detail = data.error.message
    message = event.message or ""
    return detail.strip() or message or f"the run ended {run.status.value}", message


def find_run(instance: dg.DagsterInstance, request: ReprocessRequest) -> Optional[RunOutcome]:
    """The run asked for ``request`` (by run key ``<asset>:<id>``; before that key, runs were keyed by the bare
    id, and such a run of the same asset counts too), or None when none exists yet."""
    records = []
    for key in (request.run_key, request.id):
        records = instance.get_run_records(filters=dg.RunsFilter(tags={RUN_KEY_TAG: key, QUERY_TAG: request.asset}),
                                           limit=1)
        if records:
            break
    if not records:
        return None
    run = records[0].dagster_run
    succeeded = run.status == dg.DagsterRunStatus.SUCCESS
    reason, event = ("", "") if succeeded or not run.is_finished else _failure(instance, run)
    op_config = ((run.run_config or {}).get("ops") or {}).get(request.asset, {}).get("config", {})
    return RunOutcome(run_id=run.run_id, job_name=run.job_name, run_key=run.tags.get(RUN_KEY_TAG, ""),
                      status=run.status.value, finished=run.is_finished, succeeded=succeeded, reason=reason,
                      failure_event=event,
                      requested_by=run.tags.get(REQUEST_TAG, ""), op_config=dict(op_config))


def outcome_note(name: str, request: ReprocessRequest, run: RunOutcome) -> str:
    """The note beside a request whose run ended: which run, how it ended, why it failed."""
    verdict = "succeeded" if run.succeeded else "failed"
    lines = [f"{verdict}: run {run.run_id} of {run.job_name} (run_key {run.run_key}) ended {run.status}"]
    if not run.succeeded:
        lines.append(f"reason: {run.reason}")
        if run.failure_event and run.failure_event != run.reason:
            lines.append(f"run failure event: {run.failure_event}")
    lines.append(f"request: {json.dumps(request.to_dict())}")
    if run.requested_by and run.requested_by != name:
        lines.append(f"that run was asked for by {shown(run.requested_by)}, which has the same asset and id: one "
                     "asset and id run once")
        if run.op_config != request.op_config:
            lines.append(f"this request asked for {json.dumps(request.op_config)}, the run had "
                         f"{json.dumps(run.op_config)}: to run it, drop it again with a new id")
    if not run.succeeded and not lines[-1].endswith("with a new id"):
        # dropped again under the same id, it would be filed here at once, with this run's failure
        lines.append('to try again once the cause is mended, drop the request with a new "id" (one asset and id run '
                     "once)")
    note = "\n".join(lines)
    return note if len(note) <= MAX_NOTE_BYTES else note[: MAX_NOTE_BYTES - 20] + "\n... (cut)"


# ---- the cursor -----------------------------------------------------------------------------------------------


def digest(text: str) -> str:
    """16 hex digits naming a run key or a reported problem in the cursor (its size stays fixed)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SensorCursor:
    """What the sensor remembers between evaluations; each list at most MAX_REMEMBERED digests."""

    asked: tuple[str, ...] = ()  # run keys asked for whose runs did not exist at the last evaluation
    reported: tuple[str, ...] = ()  # problems already reported (entries left alone, unusable folders)

    @classmethod
    def parse(cls, text: Optional[str]) -> "SensorCursor":
        """An unreadable (or older) cursor is read as empty: at worst a problem is reported once more."""
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}

        def digests(key: str) -> tuple[str, ...]:
            value = doc.get(key)
            return tuple(d for d in value if isinstance(d, str) and len(d) == 16) if isinstance(value, list) else ()

        return cls(asked=digests("asked"), reported=digests("reported"))

    def to_dict(self) -> dict:
        return {"asked": list(self.asked), "reported": list(self.reported)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


def _bounded(ordered: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(ordered))[-MAX_REMEMBERED:]


# ---- one evaluation -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Review:
    """What one evaluation found and did: runs to ask for, what happened (log), how things stand, the cursor."""

    run_requests: tuple  # dg.RunRequest, one per new asset and id
    events: tuple[str, ...]  # moves, runs asked for, problems reported for the first time
    problems: tuple[str, ...]  # the subset of events that are problems (logged as warnings)
    status: tuple[str, ...]  # requests still waiting, and why
    cursor: SensorCursor

    def to_dict(self) -> dict:
        return {"run_requests": [r.run_key for r in self.run_requests], "events": list(self.events),
                "problems": list(self.problems), "status": list(self.status), "cursor": self.cursor.to_dict()}


def review_requests(folder: RequestFolder, names: set[str], instance: dg.DagsterInstance,
                    cursor: SensorCursor) -> Review:
    """Judge every name in the folder once: ask for new runs, move requests whose run ended, reject what is
    unusable, report the rest once (what was reported before, per ``cursor``, is not reported again)."""
    run_requests, events, problems, status = [], [], [], []
    waiting: list[str] = []  # digests of run keys without a run yet (asked now or before)
    reported: list[str] = []  # digests of every problem present now
    asking: dict[str, str] = {}  # run key asked for in this evaluation -> its request file
    asked_before, reported_before = set(cursor.asked), set(cursor.reported)

    def report_once(key: str, message: str) -> None:
        reported.append(digest(key))
        if digest(key) not in reported_before:
            events.append(message)
            problems.append(message)

    def move(entry: Entry, where: str, to: str, note: str, what: str) -> None:
        try:
            moved = folder.move(entry, to, note)
        except EntryChangedError as e:
            status.append(f"{where}: {e}; judged again at the next evaluation")
        except UnsafeFolderError as e:
            report_once(f"unsafe\0{to}\0{entry.identity}", f"{where}: {what}, but not moved: {e}")
            status.append(f"{where}: {what}; stays until {to}/ is a real directory")
        except (RequestFolderError, OSError) as e:
            report_once(f"stuck\0{to}\0{entry.identity}", f"{where}: {what}, but not moved: {e}")
            status.append(f"{where}: {what}; stays until it can be moved to {to}/")
        else:
            events.append(f"{where}: {what} (moved to {moved.dest}, the note in {moved.note})")

    for entry in folder.entries():
        where = folder.where(shown(entry.name))
        if entry.action == OWN:
            continue
        if entry.action == LEAVE:
            report_once(entry.identity, f"{where}: {entry.reason} (left alone; reported once)")
            continue
        if entry.action == REJECT:
            move(entry, where, REJECTED, f"rejected: {entry.reason}", f"rejected: {entry.reason}")
            continue
        try:
            request = parse_request(folder.read(entry), entry.name[: -len(REQUEST_SUFFIX)], names)
        except EntryChangedError as e:
            status.append(f"{where}: {e}; judged again at the next evaluation")
            continue
        except (UnreadableRequestError, RequestError) as e:
            move(entry, where, REJECTED, f"rejected: {e}", f"rejected: {_one_line(str(e))}")
            continue
        key = request.run_key
        run = find_run(instance, request)
        if run is None:
            waiting.append(digest(key))
            if key in asking:
                status.append(f"{where}: same asset and id as {asking[key]}; one run (run_key {key}) serves both")
            elif digest(key) in asked_before:
                status.append(f"{where}: waiting for its run (run_key {key}) to be created")
            else:
                run_requests.append(dg.RunRequest(
                    run_key=key, job_name=job_name(request.asset),
                    run_config={"ops": {request.asset: {"config": request.op_config}}},
                    tags={REQUEST_TAG: entry.name, QUERY_TAG: request.asset}))
                asking[key] = shown(entry.name)
                events.append(f"{where}: run asked for (job {job_name(request.asset)}, run_key {key}, "
                              f"{json.dumps(request.op_config)})")
        elif not run.finished:
            status.append(f"{where}: its run {run.run_id} is {run.status}; the request stays until the run ends")
        else:
            verdict = "its run succeeded" if run.succeeded else f"its run failed: {_one_line(run.reason, 200)}"
            move(entry, where, HANDLED if run.succeeded else FAILED, outcome_note(entry.name, request, run),
                 f"{verdict} (run {run.run_id})")
    asked = [d for d in [*cursor.asked, *(digest(k) for k in asking)] if d in set(waiting)]
    return Review(run_requests=tuple(run_requests), events=tuple(events), problems=tuple(problems),
                  status=tuple(status), cursor=SensorCursor(asked=_bounded(asked), reported=_bounded(reported)))


def _skip_reason(review: Review, folder: str) -> str:
    lines = [_one_line(line) for line in (*review.events, *review.status)]
    text = "; ".join(lines) or f"no new request in {folder}"
    return text if len(text) <= MAX_SKIP_REASON else text[: MAX_SKIP_REASON - 40] + f"... ({len(lines)} lines)"


def reprocess_request_sensor(queries: list[StreamingQuery], jobs: list) -> dg.SensorDefinition:
    names = {q.name for q in queries}

    @dg.sensor(name="reprocess_request_sensor", jobs=jobs, minimum_interval_seconds=30,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Turns each request file in <home>/reprocess-requests/ into one rollback-and-reprocess "
                           "run, and files it under handled/ or failed/ when the run ends.")
    def _sensor(context: dg.SensorEvaluationContext,
                streaming_settings: StreamingSettings) -> Union[dg.SensorResult, dg.SkipReason]:
        path = streaming_settings.requests_dir
        try:
            folder = RequestFolder.open(path)
        except FileNotFoundError:
            return dg.SkipReason(f"no request folder yet ({path})")
        except NotADirectoryError:
            return dg.SkipReason(f"{path} is not a directory: remove it, or point home elsewhere")
        with folder:
            review = review_requests(folder, names, context.instance, SensorCursor.parse(context.cursor))
        for line in review.events:
            if line in review.problems:
                context.log.warning(_one_line(line, 2000))
            else:
                context.log.info(_one_line(line, 2000))
        cursor = review.cursor.to_json()
        if not review.run_requests:
            return dg.SensorResult(skip_reason=_skip_reason(review, path), cursor=cursor)
        return dg.SensorResult(run_requests=list(review.run_requests), cursor=cursor)

    return _sensor
