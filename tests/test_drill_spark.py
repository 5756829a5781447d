"""Restore drills on real backups: a good backup restores into scratch space and Spark restarts the query on
it (noop sink); a backup whose restart set was damaged in the destination (an object of ``offsets/N``, or of a
state file) fails, naming the cause and the file; the recovery point stays with the newest backup that passed.
From the library, the CLI (``backup drill``) and Dagster (``checkpoint_restore_drill_job``,
``restore_drill_check``)."""

from __future__ import annotations

import os
import uuid

import dagster as dg
import pytest

from checkpoint_ops.backup import Repository, apply_backup_prune, create_backup, list_backups, plan_backup_prune
from checkpoint_ops.drill import drill_records, run_drill
from checkpoint_ops.model import Checkpoint
from checkpoint_ops.restart_judge import restart_files
from dagster_checkpoint_ops.drill import drill_result
from dagster_checkpoint_ops.streaming import StreamingQuery, streaming_definitions
from tests.compat_queries import agg_writer, restart_for_real, use_session_conf
from tests.helpers import cli_json, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL, SESSION_CONF


def backup(base, dest: str) -> str:
    return create_backup(base.checkpoint, dest, [base.output], source_compact_interval=COMPACT_INTERVAL,
                         sink_compact_interval=COMPACT_INTERVAL)["backup_id"]


def corrupt(repo: Repository, backup_id: str, rel: str) -> None:
    """Flip bytes of the stored object holding ``checkpoint/<rel>`` (as a bad disk or a stray write would)."""
    manifest = next(m for m in repo.manifests(refresh=True) if m.id == backup_id)
    (sha,) = [sha for path, sha, _ in manifest.files("checkpoint") if path == rel]
    path = repo.object_path(sha)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.fixture
def agg(spark, compat_bases):
    base = compat_bases("agg")
    base.reset()
    use_session_conf(spark)
    yield base
    use_session_conf(spark)
    base.reset()


def restart_file(base, kind: str, repo: Repository | None = None, backup_id: str | None = None) -> str:
    """A file of the restart set of the checkpoint's last batch N: ``offsets/N``, or a state file Spark
    loads version N+1 from whose stored object no other file (of this or an older backup) shares: damage
    to that object is damage to that one file."""
    ckpt = Checkpoint.open(base.checkpoint)
    if kind == "offsets":
        return f"offsets/{ckpt.latest_commit}"
    needed = set(restart_files(ckpt, ckpt.latest_commit))
    manifests = repo.manifests(refresh=True)
    uses: dict[str, int] = {}
    for m in manifests:
        for _, sha, _ in m.files("checkpoint"):
            uses[sha] = uses.get(sha, 0) + 1
    files = next(m for m in manifests if m.id == backup_id).files("checkpoint")
    return next(rel for rel, sha, _ in files if rel in needed and rel.startswith("state/0/")
                and rel.endswith((".delta", ".snapshot")) and uses[sha] == 1)


@pytest.mark.parametrize("damaged", ["offsets", "state"])
def test_good_backup_passes_damaged_one_fails_naming_the_file(spark, agg, tmp_path, damaged):
    dest, scratch = str(tmp_path / "backups"), str(tmp_path / "scratch")
    good = backup(agg, dest)
    repo = Repository.open(dest)
    before = tree_snapshot(agg.root)

    result = run_drill(repo, good, spark, lambda s: agg_writer(s, agg), scratch_url=scratch)
    assert result.passed and result.stage == "passed" and result.cause is None, result.render()
    assert result.judge.restarted and result.judge.batch == agg.batch + 1
    assert result.judge.operators == ("stateStoreSave",)
    assert result.recovery_point_backup == good and result.recovery_point_s >= 0
    assert result.recovery_time_s == pytest.approx(result.restore_s + result.restart_s) and result.restore_s > 0
    assert drill_records(repo)[good]["passed"] is True
    assert tree_snapshot(agg.root) == before, "a drill changed the checkpoint or its output"
    assert not os.listdir(scratch), "the drill left scratch files"

    agg.add_events(3, 5)  # the query runs on: a newer backup, with new offsets and state files
    assert restart_for_real(spark, agg_writer(spark, agg), agg.checkpoint).ok
    newer = backup(agg, dest)
    rel = restart_file(agg, damaged, repo, newer)
    corrupt(repo, newer, rel)

    failed = run_drill(repo, None, spark, lambda s: agg_writer(s, agg), scratch_url=scratch)  # the newest
    assert failed.backup_id == newer and not failed.passed and failed.stage == "restore", failed.render()
    assert failed.cause_files == (f"checkpoint/{rel}",)
    assert "does not match its hash" in failed.cause
    assert failed.recovery_point_backup == good  # the newest backup that passed
    assert drill_records(repo)[newer]["passed"] is False
    assert [(b.id, b.drill["passed"]) for b in list_backups(repo)] == [(good, True), (newer, False)]
    assert not os.listdir(scratch)

    apply_backup_prune(repo, plan_backup_prune(repo, keep_last=1))  # a pruned backup takes its drill record along
    assert set(drill_records(repo)) == {newer}


def test_a_drill_stopped_by_the_store_records_no_failed_drill(spark, agg, tmp_path, faulty_s3, s3_server, bucket):
    """The backup destination's store fails part-way through a drill's restore, through every retry: the drill
    stops with the store's error, saying to run it again, and records nothing against the backup (nor is its
    scratch copy left). Before, the outage counted as a restore that failed: a failed drill of a good backup (its
    recovery point moved back; Dagster's drill check turned ERROR), or the record's own write failed in its place
    with "nothing was changed"."""
    from checkpoint_ops.errors import StoreUnavailableError

    dest, scratch = f"s3://{bucket}/backups", str(tmp_path / "scratch")
    good = create_backup(agg.checkpoint, dest, [agg.output], {"endpoint_url": s3_server},
                         source_compact_interval=COMPACT_INTERVAL, sink_compact_interval=COMPACT_INTERVAL)["backup_id"]
    via_proxy = {"endpoint_url": faulty_s3.endpoint}
    faulty_s3.outage(5, after_requests=10, of_kind="GET")  # part-way through the restore's reads of the objects
    try:
        with pytest.raises(StoreUnavailableError) as got:
            run_drill(Repository.open(dest, via_proxy), good, spark, lambda s: agg_writer(s, agg), scratch_url=scratch,
                      storage_options=via_proxy)
    finally:
        faulty_s3.calm()
    assert "the drill stopped before it judged the backup" in got.value.fix, got.value.render()
    assert drill_records(Repository.open(dest, {"endpoint_url": s3_server})) == {}
    assert not os.path.exists(scratch) or not os.listdir(scratch), "the drill left scratch files"


def test_cli_backup_drill(spark, agg, tmp_path, monkeypatch):
    dest = str(tmp_path / "backups")
    good = backup(agg, dest)
    name = f"drill_streams_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("from tests.compat_queries import CompatBase, agg_writer\n"
                                         f"BASE = CompatBase('agg', {agg.root!r})\n"
                                         "def build(spark):\n    return agg_writer(spark, BASE)\n")
    monkeypatch.chdir(tmp_path)
    code, doc = cli_json("backup", "drill", dest, "--query", f"{name}:build", "--scratch", str(tmp_path / "s"))
    assert code == 0 and doc["passed"] and doc["backup_id"] == good and doc["stage"] == "passed"
    assert {"recovery_time_s", "recovery_point_s", "recovery_point_backup", "restore_s", "restart_s", "cause",
            "cause_files", "judge", "batch", "drilled_at"} <= set(doc)

    corrupt(Repository.open(dest), good, restart_file(agg, "offsets"))
    code, doc = cli_json("backup", "drill", dest, good, "--query", f"{name}:build")
    assert code == 1 and not doc["passed"] and doc["cause_files"] == [f"checkpoint/{restart_file(agg, 'offsets')}"]
    assert doc["recovery_point_backup"] is None  # its only backup no longer passes

    code, doc = cli_json("backup", "drill", str(tmp_path / "nowhere"), "--query", f"{name}:build")
    assert code == 2 and "no backups here" in doc["problem"]


def test_dagster_drill_job_and_check(spark, agg, tmp_path):
    home = str(tmp_path / "home")
    query = StreamingQuery(name="drilled", build=lambda s: agg_writer(s, agg), checkpoint=agg.checkpoint,
                           sinks=[agg.output])
    defs = streaming_definitions([query], home=home, spark_config=SESSION_CONF)
    settings = defs.resources["streaming_settings"]
    good = backup(agg, settings.backup_dest("drilled"))

    result = defs.resolve_job_def("checkpoint_restore_drill_job").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert result.success, result.all_events
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "restore_drill_check" and evaluation.passed
    md = {k: v.value for k, v in evaluation.metadata.items()}
    assert md["drill_backup_id"] == good and md["recovery_point_backup"] == good
    assert md["recovery_time_s"] > 0 and md["recovery_point_s"] >= 0
    (observation,) = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert observation.asset_key == dg.AssetKey("drilled")

    # evaluated on its own (or in a materialization's step): the newest recorded drill, without drilling again
    verdict = drill_result(query, settings, defs.resources["checkpoint_files"])
    assert verdict.passed and verdict.metadata["drill_backup_id"].value == good
