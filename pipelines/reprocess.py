"""Reprocessing requests dropped as files: ``<home>/reprocess-requests/*.json`` becomes a run.

A request is ``{"asset": "<name>", "to_batch": N}`` or ``{"asset": "<name>", "to_time": "<ISO 8601>"}``, with
an optional ``"id"`` (default: the file name without ``.json``). Each becomes one rollback-and-reprocess run
of that asset with ``run_key`` = the id, so a request never runs twice.

A request file stays where it is until its run exists, then moves to ``handled/`` with the run id beside it
(a daemon that dies between asking for the run and creating it asks again; the run key keeps that to one
run). A malformed request, or one for an unknown asset, moves to ``rejected/`` with its reason beside it.
Nothing is deleted. The cursor remembers which run keys were asked for and not yet seen as runs.
"""

import json
import os
from datetime import datetime
from typing import Optional, Union

import dagster as dg

from pipelines.query import StreamingQuery, job_name
from resources.settings import StreamingSettings

RUN_KEY_TAG = "dagster/run_key"
MAX_PENDING_IN_CURSOR = 1000


def parse_request(path: str, names: set[str]) -> tuple[str, str, dict]:
    """(asset, run key, op config) of a request file; ValueError saying what is wrong."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError('not a JSON object like {"asset": "<name>", "to_batch": 12}')
    asset = doc.get("asset")
    if asset not in names:
        raise ValueError(f'unknown asset {asset!r} in "asset" (streaming assets here: {", ".join(sorted(names))})')
    if ("to_batch" in doc) == ("to_time" in doc):
        raise ValueError('give exactly one of "to_batch" (a batch id) and "to_time" (an ISO 8601 time)')
    config: dict = {}
    if "to_batch" in doc:
        if not isinstance(doc["to_batch"], int) or isinstance(doc["to_batch"], bool) or doc["to_batch"] < 0:
            raise ValueError(f'"to_batch" must be a batch id (a non-negative integer), not {doc["to_batch"]!r}')
        config["rollback_to_batch"] = doc["to_batch"]
    else:
        try:
            datetime.fromisoformat(str(doc["to_time"]))
        except ValueError:
            raise ValueError(f'"to_time" {doc["to_time"]!r} is not an ISO 8601 time (e.g. 2026-11-21T06:30:00Z)') \
                from None
        config["rollback_to_time"] = str(doc["to_time"])
    key = doc.get("id", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(key, str) or not key.strip():
        raise ValueError('"id" must be a non-empty string')
    unknown = set(doc) - {"asset", "to_batch", "to_time", "id"}
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)} (allowed: asset, to_batch, to_time, id)")
    return asset, key, config


def mark(path: str, folder: str, note: str) -> str:
    """Move a request into ``folder`` beside it, with a note saying why; never overwrites."""
    d = os.path.join(os.path.dirname(path), folder)
    os.makedirs(d, exist_ok=True)
    target = os.path.join(d, os.path.basename(path))
    n = 1
    while os.path.exists(target):  # the same name came again: keep both
        target = os.path.join(d, f"{os.path.basename(path)}.{n}")
        n += 1
    os.replace(path, target)
    with open(target + ".reason.txt", "w") as f:
        f.write(note + "\n")
    return target


def _run_for_key(instance: Optional[dg.DagsterInstance], key: str):
    if instance is None:
        return None
    records = instance.get_run_records(filters=dg.RunsFilter(tags={RUN_KEY_TAG: key}), limit=1)
    return records[0].dagster_run if records else None


def reprocess_request_sensor(queries: list[StreamingQuery], jobs: list) -> dg.SensorDefinition:
    names = {q.name for q in queries}

    @dg.sensor(name="reprocess_request_sensor", jobs=jobs, minimum_interval_seconds=30,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Turns each request file in <home>/reprocess-requests/ into one rollback-and-reprocess run.")
    def _sensor(context: dg.SensorEvaluationContext,
                streaming_settings: StreamingSettings) -> Union[dg.SensorResult, dg.SkipReason]:
        folder = streaming_settings.requests_dir
        try:
            pending = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".")
                             and os.path.isfile(os.path.join(folder, n)))
        except FileNotFoundError:
            return dg.SkipReason(f"no request folder yet ({folder})")
        asked: list = json.loads(context.cursor)["asked"] if context.cursor else []
        requests, notes, seen = [], [], set()
        for name in pending:
            path = os.path.join(folder, name)
            try:
                asset, key, config = parse_request(path, names)
            except ValueError as e:
                mark(path, "rejected", str(e))
                notes.append(f"rejected {path}: {e} (moved to rejected/, reason beside it)")
                continue
            run = _run_for_key(context.instance, key)
            if run is not None:
                mark(path, "handled", f"run {run.run_id} (run_key {key}, job {run.job_name})")
                notes.append(f"{path}: handled by run {run.run_id} (moved to handled/)")
            elif key in seen:
                mark(path, "handled", f"duplicate: another request in this folder has id {key!r}; it runs once")
                notes.append(f"{path}: duplicate id {key!r} (moved to handled/)")
            elif key in asked:
                notes.append(f"{path}: waiting for its run (run_key {key}) to be created")
            else:
                requests.append(dg.RunRequest(run_key=key, job_name=job_name(asset),
                                              run_config={"ops": {asset: {"config": config}}},
                                              tags={"reprocess/request": name, "checkpoint/query": asset}))
                asked.append(key)
            seen.add(key)
        for n in notes:
            context.log.info(n)
        cursor = json.dumps({"asked": [k for k in asked if k in seen][-MAX_PENDING_IN_CURSOR:]})
        if not requests:
            return dg.SensorResult(skip_reason="; ".join(notes) or f"no new request in {folder}", cursor=cursor)
        return dg.SensorResult(run_requests=requests, cursor=cursor)

    return _sensor
