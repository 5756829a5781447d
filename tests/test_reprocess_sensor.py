"""reprocess_request_sensor without Spark: requests become runs keyed by asset and id, wait for their runs
to end and land in handled/ or failed/ with the outcome, and nothing in the folder can trick the sensor into
following a link, reading a huge file, growing its cursor or staying silent.

Runs are real runs in a real instance: asked-for runs of the streaming job are created (queued) as the daemon
would and canceled through the instance, and runs that end are executed in process by a small stand-in job
tagged with the request's run key (the streaming job itself needs Spark: test_dagster_streaming.py runs it).
"""

import json
import os
import stat

import dagster as dg
import pytest

from dagster_checkpoint_ops.reprocess import MAX_REMEMBERED, SensorCursor
from dagster_checkpoint_ops.request_folder import MAX_REQUEST_BYTES, note_text
from tests.test_dagster_definitions import make_defs


@pytest.fixture
def instance():
    """A real instance per test, in memory (runs, their events and tags as the daemon would record them)."""
    inst = dg.DagsterInstance.ephemeral()
    yield inst
    inst.dispose()


def sensor_tick(defs, instance, cursor=None):
    sensor = defs.resolve_sensor_def("reprocess_request_sensor")
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"streaming_settings": defs.resources["streaming_settings"]})
    return sensor.evaluate_tick(ctx)


def folder_of(home) -> str:
    return os.path.join(str(home), "reprocess-requests")


def drop(home, name, doc) -> str:
    os.makedirs(folder_of(home), exist_ok=True)
    path = os.path.join(folder_of(home), name)
    with open(path, "wb") as f:
        f.write(doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode())
    return path


def note(home, rel) -> str:
    with open(os.path.join(folder_of(home), rel + ".reason.txt")) as f:
        return f.read()


def listing(home) -> dict:
    """Every name under the request folder (links not followed) -> its kind and content or link target."""
    out = {}
    for parent, dirs, files in os.walk(folder_of(home)):
        for name in dirs + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, folder_of(home))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    out[rel] = ("file", f.read())
            else:
                out[rel] = (stat.S_IFMT(st.st_mode), None)
    return out


@dg.op(config_schema={"failure": dg.Field(str, is_required=False)})
def stand_in_step(context):
    if context.op_config.get("failure"):
        raise dg.Failure(description=context.op_config["failure"])


@dg.job
def stand_in_job():
    stand_in_step()


def end_run(instance, request: dg.RunRequest, failure=None) -> dg.ExecuteInProcessResult:
    """A run recorded under the request's run key and tags (as the daemon records the run it launches) that
    succeeds, or fails with ``failure`` as its step's error."""
    config = {"ops": {"stand_in_step": {"config": {"failure": failure} if failure else {}}}}
    return stand_in_job.execute_in_process(instance=instance, run_config=config, raise_on_error=False,
                                           tags={**request.tags, "dagster/run_key": request.run_key})


def test_request_waits_for_its_run_then_lands_by_outcome(tmp_path, instance):
    home = tmp_path
    defs = make_defs(home)
    assert "no request folder" in sensor_tick(defs, instance).skip_message
    drop(home, "fix-bad-batch.json", {"asset": "alpha", "to_batch": 7, "id": "INC-1234"})
    drop(home, "by-time.json", {"asset": "beta", "to_time": "2026-11-21T06:30:00Z"})
    first = sensor_tick(defs, instance)
    by_key = {r.run_key: r for r in first.run_requests}
    assert set(by_key) == {"alpha:INC-1234", "beta:by-time"}  # <asset>:<id>, the id defaulting to the file name
    alpha = by_key["alpha:INC-1234"]
    assert alpha.job_name == "alpha_job"
    assert alpha.run_config == {"ops": {"alpha": {"config": {"rollback_to_batch": 7}}}}
    assert dg.validate_run_config(defs.resolve_job_def("alpha_job"), alpha.run_config)
    assert by_key["beta:by-time"].run_config["ops"]["beta"]["config"] == {"rollback_to_time": "2026-11-21T06:30:00Z"}

    again = sensor_tick(defs, instance, first.cursor)  # before the runs exist: nothing asked twice
    assert again.run_requests == [] and again.skip_message.count("waiting for its run") == 2

    # alpha's run is created (as the daemon creates it) and not started yet; beta's runs and succeeds
    queued = instance.create_run_for_job(defs.resolve_job_def("alpha_job"), run_config=alpha.run_config,
                                         tags={**alpha.tags, "dagster/run_key": alpha.run_key})
    beta_run = end_run(instance, by_key["beta:by-time"])
    assert beta_run.success
    third = sensor_tick(defs, instance, again.cursor)
    assert third.run_requests == []
    assert f"its run {queued.run_id} is NOT_STARTED; the request stays until the run ends" in third.skip_message
    assert os.path.exists(os.path.join(folder_of(home), "fix-bad-batch.json"))
    assert not os.path.exists(os.path.join(folder_of(home), "by-time.json"))
    text = note(home, "handled/by-time.json")
    assert text.startswith(f"succeeded: run {beta_run.run_id}") and "run_key beta:by-time" in text

    # the waiting run is canceled: the request ends in failed/, saying so
    instance.report_run_canceled(queued, message="canceled by on-call: wrong batch")
    fourth = sensor_tick(defs, instance, third.cursor)
    assert "failed/fix-bad-batch.json" in fourth.skip_message
    text = note(home, "failed/fix-bad-batch.json")
    assert text.startswith(f"failed: run {queued.run_id} of alpha_job (run_key alpha:INC-1234) ended CANCELED")
    assert "canceled by on-call: wrong batch" in text

    # the same asset and id again: no second run; filed with the outcome of the run that id already had
    drop(home, "again.json", {"asset": "alpha", "to_batch": 3, "id": "INC-1234"})
    fifth = sensor_tick(defs, instance, fourth.cursor)
    assert fifth.run_requests == []
    text = note(home, "failed/again.json")
    assert f"run {queued.run_id}" in text and "asked for by fix-bad-batch.json" in text
    assert '{"rollback_to_batch": 3}' in text and "new id" in text

    # every request was moved once: another evaluation changes nothing
    before = listing(home)
    assert sorted(before) == ["failed", "failed/again.json", "failed/again.json.reason.txt",
                              "failed/fix-bad-batch.json", "failed/fix-bad-batch.json.reason.txt",
                              "handled", "handled/by-time.json", "handled/by-time.json.reason.txt"]
    last = sensor_tick(defs, instance, fifth.cursor)
    assert last.run_requests == [] and listing(home) == before


def test_a_failed_run_files_the_request_under_failed_with_its_reason(tmp_path, instance):
    home = tmp_path
    defs = make_defs(home)
    drop(home, "req.json", {"asset": "alpha", "to_batch": 5})
    (request,) = sensor_tick(defs, instance).run_requests
    result = end_run(instance, request, failure="rollback refused: batch 5 is not in the rollback window")
    assert not result.success
    tick = sensor_tick(defs, instance)
    assert "its run failed: rollback refused: batch 5 is not in the rollback window" in tick.skip_message
    assert not os.path.exists(os.path.join(folder_of(home), "handled", "req.json"))
    text = note(home, "failed/req.json")
    assert text.startswith(f"failed: run {result.run_id} of stand_in_job (run_key alpha:req) ended FAILURE")
    assert "reason: rollback refused: batch 5 is not in the rollback window" in text
    assert 'run failure event: Execution of run for "stand_in_job" failed.' in text
    # the same request dropped again is served by the same run (one asset and id run once): the note says so
    assert 'to try again once the cause is mended, drop the request with a new "id"' in text, text


def test_one_id_for_two_assets_runs_both(tmp_path, instance):
    home = tmp_path
    defs = make_defs(home)
    drop(home, "a.json", {"asset": "alpha", "to_batch": 2, "id": "INC-9"})
    drop(home, "b.json", {"asset": "beta", "to_batch": 4, "id": "INC-9"})
    tick = sensor_tick(defs, instance)
    by_key = {r.run_key: r for r in tick.run_requests}
    assert set(by_key) == {"alpha:INC-9", "beta:INC-9"}
    assert by_key["beta:INC-9"].job_name == "beta_job"
    runs = {key: end_run(instance, r) for key, r in by_key.items()}
    sensor_tick(defs, instance, tick.cursor)
    assert runs["alpha:INC-9"].run_id in note(home, "handled/a.json")
    assert runs["beta:INC-9"].run_id in note(home, "handled/b.json")


def test_a_run_asked_for_under_the_bare_id_still_counts(tmp_path, instance):
    """Runs asked for before run keys named the asset (run_key = the id) are not asked for again."""
    home = tmp_path
    defs = make_defs(home)
    drop(home, "old.json", {"asset": "alpha", "to_batch": 2, "id": "INC-7"})
    old = end_run(instance, dg.RunRequest(run_key="INC-7", tags={"checkpoint/query": "alpha",
                                                                 "reprocess/request": "old.json"}))
    drop(home, "other-asset.json", {"asset": "beta", "to_batch": 2, "id": "INC-7"})
    tick = sensor_tick(defs, instance)
    assert [r.run_key for r in tick.run_requests] == ["beta:INC-7"]
    assert old.run_id in note(home, "handled/old.json")


@pytest.mark.parametrize("doc, reason", [
    ("{not json", "not valid JSON"),
    (b'{"asset": "alpha", "to_batch": 3, "id": "\xff"}', "not UTF-8"),
    ('["alpha", 3]', "not a JSON object"),
    ({"asset": "gamma", "to_batch": 3}, "unknown asset 'gamma'"),
    ({"asset": "gamma", "to_batch": 3}, "a StreamingQueryComponent's query is reprocessed from its job"),
    ({"asset": "alpha"}, "exactly one"),
    ({"asset": "alpha", "to_batch": 3, "to_time": "2026-11-21T06:30:00Z"}, "exactly one"),
    ({"asset": "alpha", "to_batch": -1}, "non-negative"),
    ({"asset": "alpha", "to_batch": True}, "non-negative"),
    ({"asset": "alpha", "to_batch": 2**63}, "below 2^63"),
    ({"asset": "alpha", "to_time": "last tuesday"}, "not an ISO 8601 time"),
    ({"asset": "alpha", "to_time": 1700000000}, "not an ISO 8601 time"),
    ('{"asset": "alpha", "to_batch": 3, "asset": "beta"}', "appears twice"),
    ({"asset": "alpha", "to_batch": 3, "id": ""}, '"id" must be at most 128 characters of A-Z a-z 0-9 . _ : -'),
    ({"asset": "alpha", "to_batch": 3, "id": "x" * 129}, '"id" must be at most 128 characters of A-Z a-z 0-9'),
    ({"asset": "alpha", "to_batch": 3, "id": "INC 12/a"}, '"id" must be at most 128 characters of A-Z a-z 0-9'),
    ({"asset": "alpha", "to_batch": 3, "id": 12}, '"id" must be'),
    ({"asset": "alpha", "to_batch": 3, "batch": 4}, "unknown field"),
], ids=["json", "utf8", "array", "asset", "asset-of-a-component", "no-target", "two-targets", "negative", "bool", "huge-batch", "time",
        "time-type", "twice", "empty-id", "long-id", "id-chars", "id-type", "field"])
def test_bad_requests_are_rejected_with_the_reason(tmp_path, instance, doc, reason):
    home = tmp_path
    path = drop(home, "req.json", doc)
    tick = sensor_tick(make_defs(home), instance)
    assert tick.run_requests == []
    assert path in tick.skip_message and reason in tick.skip_message, tick.skip_message
    assert not os.path.exists(path)
    assert note(home, "rejected/req.json").startswith("rejected: ")
    assert reason in note(home, "rejected/req.json")


def test_a_file_name_that_is_no_id_needs_an_id(tmp_path, instance):
    home = tmp_path
    defs = make_defs(home)
    drop(home, "fix bad batch.json", {"asset": "alpha", "to_batch": 3})
    drop(home, "fix bad batch 2.json", {"asset": "alpha", "to_batch": 3, "id": "fix-bad-batch-2"})
    tick = sensor_tick(defs, instance)
    assert [r.run_key for r in tick.run_requests] == ["alpha:fix-bad-batch-2"]
    assert 'no "id", and the file name \'fix bad batch\' is not one' in note(home, "rejected/fix bad batch.json")


def test_huge_requests_are_refused_unread_and_never_reach_the_cursor_or_a_tag(tmp_path, instance):
    home = tmp_path
    defs = make_defs(home)
    huge_id = "I" * (5 * 1024 * 1024)
    huge = drop(home, "huge.json", {"asset": "alpha", "to_batch": 3, "id": huge_id})
    drop(home, "long.json", {"asset": "alpha", "to_batch": 3, "id": "L" * 129})
    tick = sensor_tick(defs, instance)
    assert tick.run_requests == []
    size = os.path.getsize(os.path.join(folder_of(home), "rejected", "huge.json"))
    assert f"{size} bytes: a request is at most {MAX_REQUEST_BYTES} bytes" in note(home, "rejected/huge.json")
    assert f"{huge}: rejected: {size} bytes" in tick.skip_message
    assert "at most 128 characters" in note(home, "rejected/long.json")
    assert "I" * 100 not in tick.skip_message and "L" * 100 not in tick.skip_message
    assert len(tick.skip_message) < 4000 and len(tick.cursor) < 200

    longest = "M" * 128
    drop(home, "longest.json", {"asset": "alpha", "to_batch": 3, "id": longest})
    tick = sensor_tick(defs, instance, tick.cursor)
    (request,) = tick.run_requests
    assert request.run_key == f"alpha:{longest}"
    assert request.tags["reprocess/request"] == "longest.json" and max(len(v) for v in request.tags.values()) < 40
    assert len(tick.cursor) < 200 and "M" * 20 not in tick.cursor


def test_the_cursor_stays_bounded(tmp_path, instance):
    home = tmp_path
    defs = make_defs(home)
    for n in range(MAX_REMEMBERED + 100):
        drop(home, f"note-{n:04d}.txt", "not a request")
    drop(home, "req.json", {"asset": "alpha", "to_batch": 1})
    tick = sensor_tick(defs, instance)
    cursor = SensorCursor.parse(tick.cursor)
    assert len(cursor.reported) == MAX_REMEMBERED and len(cursor.asked) == 1
    assert len(tick.cursor) < 20 * (MAX_REMEMBERED + 10)
    assert len(tick.run_requests) == 1


def test_what_is_not_a_request_is_reported_once_with_its_reason(tmp_path, instance):
    home, outside = tmp_path, tmp_path / "outside"
    defs, folder = make_defs(home), folder_of(home)
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"asset": "alpha", "to_batch": 1, "id": "via-link"}))
    os.makedirs(os.path.join(folder, "x.json"))
    os.makedirs(os.path.join(folder, "sub"))
    os.symlink(outside / "secret.json", os.path.join(folder, "linked.json"))
    os.symlink(outside / "nowhere.json", os.path.join(folder, "dangling.json"))
    os.symlink(outside, os.path.join(folder, "elsewhere"))
    os.mkfifo(os.path.join(folder, "pipe.json"))
    drop(home, "UPPER.JSON", {"asset": "alpha", "to_batch": 1})
    drop(home, "Mixed.Json", {"asset": "alpha", "to_batch": 1})
    drop(home, "notes.txt", "remember to roll back")
    drop(home, ".uploading.json", {"asset": "alpha", "to_batch": 1})

    first = sensor_tick(defs, instance)
    assert first.run_requests == []  # nothing was read through a link
    # moved to rejected/, with the reason beside them
    assert "symbolic link, not a regular file" in note(home, "rejected/linked.json")
    assert "symbolic link, not a regular file" in note(home, "rejected/dangling.json")
    assert "lowercase .json: drop it again as UPPER.json" in note(home, "rejected/UPPER.JSON")
    assert "lowercase .json: drop it again as Mixed.json" in note(home, "rejected/Mixed.Json")
    assert os.readlink(os.path.join(folder, "rejected", "linked.json")) == str(outside / "secret.json")
    assert (outside / "secret.json").read_text().startswith("{")  # the link moved, not what it points to
    assert sorted(os.listdir(outside)) == ["secret.json"]

    # left alone, each reported once
    for name, reason in [("x.json", "a directory named like a request"), ("sub", "not a request (a directory"),
                         ("pipe.json", "a special file named like a request"),
                         ("elsewhere", "not a request (a symbolic link"),
                         ("notes.txt", "not a request (a regular file"),
                         (".uploading.json", "a hidden name is not a request")]:
        assert f"{os.path.join(folder, name)}: {reason}" in first.skip_message, (name, first.skip_message)
    second = sensor_tick(defs, instance, first.cursor)
    assert second.skip_message == f"no new request in {folder}", second.skip_message
    assert all(os.path.lexists(os.path.join(folder, n))
               for n in ("x.json", "sub", "pipe.json", "elsewhere", "notes.txt", ".uploading.json"))

    # something new under a reported name is reported again
    os.unlink(os.path.join(folder, "notes.txt"))
    os.makedirs(os.path.join(folder, "notes.txt"))
    third = sensor_tick(defs, instance, second.cursor)
    assert f"{os.path.join(folder, 'notes.txt')}: not a request (a directory" in third.skip_message
    assert "x.json" not in third.skip_message


def test_a_link_planted_at_a_note_is_never_written_through(tmp_path, instance):
    home, outside = tmp_path, tmp_path / "outside"
    defs, folder = make_defs(home), folder_of(home)
    outside.mkdir()
    (outside / "victim.txt").write_text("untouched\n")
    os.makedirs(os.path.join(folder, "rejected"))
    os.symlink(outside / "victim.txt", os.path.join(folder, "rejected", "req.json.reason.txt"))
    os.symlink(outside / "created.txt", os.path.join(folder, "rejected", "req.json.1.reason.txt"))  # dangling
    drop(home, "req.json", "{not json")
    tick = sensor_tick(defs, instance)
    assert "moved to rejected/req.json.2" in tick.skip_message, tick.skip_message
    assert "not valid JSON" in note(home, "rejected/req.json.2")
    assert (outside / "victim.txt").read_text() == "untouched\n"
    assert sorted(os.listdir(outside)) == ["victim.txt"]  # nothing created through the dangling link
    assert os.readlink(os.path.join(folder, "rejected", "req.json.reason.txt")) == str(outside / "victim.txt")
    assert not os.path.lexists(os.path.join(folder, "rejected", "req.json"))
    assert not os.path.lexists(os.path.join(folder, "rejected", "req.json.1"))


def test_an_outcome_folder_that_is_a_link_is_refused(tmp_path, instance):
    home, outside = tmp_path, tmp_path / "outside"
    defs, folder = make_defs(home), folder_of(home)
    outside.mkdir()
    os.makedirs(folder)
    os.symlink(outside, os.path.join(folder, "rejected"))
    with open(os.path.join(folder, "handled"), "w") as f:
        f.write("a file where handled/ belongs\n")
    drop(home, "bad.json", "{not json")
    first = sensor_tick(defs, instance)
    text = first.skip_message
    assert f"{os.path.join(folder, 'rejected')} is a symbolic link, not a directory" in text
    assert f"{os.path.join(folder, 'handled')}: a regular file, not a directory" in text
    assert "bad.json: rejected: not valid JSON" in text and "stays until rejected/ is a real directory" in text

    drop(home, "good.json", {"asset": "alpha", "to_batch": 1})
    (request,) = sensor_tick(defs, instance, first.cursor).run_requests
    end_run(instance, request)
    third = sensor_tick(defs, instance, first.cursor)
    text = third.skip_message
    assert "is a symbolic link, not a directory" not in text  # reported once
    assert "stays until rejected/ is a real directory" in text  # still waiting, and saying so
    assert "good.json: its run succeeded" in text and "stays until handled/ is a real directory" in text
    assert os.listdir(outside) == []
    assert os.path.exists(os.path.join(folder, "bad.json")) and os.path.exists(os.path.join(folder, "good.json"))

    # fixed by an operator: both requests move, once
    os.unlink(os.path.join(folder, "rejected"))
    os.unlink(os.path.join(folder, "handled"))
    sensor_tick(defs, instance, third.cursor)
    assert "not valid JSON" in note(home, "rejected/bad.json") and "succeeded" in note(home, "handled/good.json")
    assert os.listdir(outside) == []


def test_an_interrupted_move_is_finished_into_the_same_name(tmp_path, instance):
    """Crash states of a move, as they are left on disk: the note published but the request not moved yet
    (renameat2), and the request hard-linked but its old name not removed yet (the link fallback)."""
    home = tmp_path
    defs = make_defs(home)
    folder = folder_of(home)
    path = drop(home, "req.json", "{not json")
    other = drop(home, "other.json", "[1]")
    os.makedirs(os.path.join(folder, "rejected"))
    st = os.lstat(path)
    with open(os.path.join(folder, "rejected", "req.json.reason.txt"), "w") as f:
        f.write(note_text("rejected: not valid JSON (as written before the crash)", "req.json", st))
    os.link(other, os.path.join(folder, "rejected", "other.json"))
    tick = sensor_tick(defs, instance)
    assert "moved to rejected/req.json," in tick.skip_message and "moved to rejected/other.json," in tick.skip_message
    names = sorted(os.listdir(os.path.join(folder, "rejected")))
    assert names == ["other.json", "other.json.reason.txt", "req.json", "req.json.reason.txt"]
    assert "as written before the crash" in note(home, "rejected/req.json")
    assert "not a JSON object" in note(home, "rejected/other.json")
    assert os.stat(os.path.join(folder, "rejected", "other.json")).st_nlink == 1
    assert not os.path.lexists(path) and not os.path.lexists(other)
