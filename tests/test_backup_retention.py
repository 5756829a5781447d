"""``backup prune`` retention rules, fast tier (``benchmarks.check_pass.Stream``: a checkpoint in Spark's formats,
no Spark): ``--keep-within`` keeps exactly the backups taken within the duration (it had no test), together with
``--keep-last``; the newest backup of each checkpoint is always kept; and the plan names why each one stays, as
text (the human plan printed a Python dict)."""

from __future__ import annotations

import calendar
import time

from benchmarks.check_pass import INTERVAL, Stream
from checkpoint_ops.backup import Repository, plan_backup_prune
from checkpoint_ops.backup.repository import TIME_FORMAT
from tests.helpers import cli, cli_json


def _backups(tmp_path, count: int) -> tuple[str, list[str]]:
    """``count`` backups of one synthetic checkpoint, a batch apart: (destination, ids oldest first)."""
    s = Stream(str(tmp_path / "q"), retain=100)
    dest, ids = str(tmp_path / "dest"), []
    for _ in range(count):
        s.batch()
        code, r = cli_json("backup", "create", s.ckpt, dest, "--source-compact-interval", str(INTERVAL))
        assert code == 0, r
        ids.append(r["backup_id"])
    return dest, ids


def test_keep_within_keeps_exactly_the_backups_taken_within_it(tmp_path):
    dest, ids = _backups(tmp_path, 3)
    repo = Repository.open(dest)
    created = {m.id: calendar.timegm(time.strptime(m.created, TIME_FORMAT)) for m in repo.manifests(refresh=True)}
    oldest, middle, newest = (created[i] for i in ids)
    # "now" a day after the middle one: a window of a day keeps it and the newest, the oldest only if no older
    now = middle + 86400
    plan = plan_backup_prune(repo, keep_within_s=86400, now=now)
    kept = set(plan.summary["keep"])
    assert {ids[1], ids[2]} <= kept and plan.summary["keep"][ids[2]].startswith("newest"), plan.summary
    assert (ids[0] in kept) == (now - oldest <= 86400), plan.summary
    # far in the future nothing is within it: only the newest stays, as the newest
    plan = plan_backup_prune(repo, keep_within_s=60, now=newest + 10**6)
    assert list(plan.summary["keep"]) == [ids[2]] and plan.summary["delete"] == ids[:2], plan.summary
    # with --keep-last 2 beside it: the union
    plan = plan_backup_prune(repo, keep_last=2, keep_within_s=60, now=newest + 10**6)
    assert sorted(plan.summary["keep"]) == sorted(ids[1:]) and plan.summary["delete"] == ids[:1], plan.summary


def test_prune_with_keep_within_through_the_cli(tmp_path):
    dest, ids = _backups(tmp_path, 3)
    code, out, err = cli("backup", "prune", dest, "--keep-within", "1h", "--dry-run")
    assert code == 0, err
    keep_line = next(line for line in out.splitlines() if line.strip().startswith("keep:"))
    assert "{" not in keep_line and all(f"{i}: " in keep_line for i in ids), keep_line  # each, with why
    code, r = cli_json("backup", "prune", dest, "--keep-within", "0s", "--yes")
    assert code == 0 and r["plan"]["summary"]["delete"] == ids[:2], r
    code, listed = cli_json("backup", "list", dest)
    assert [b["id"] for b in listed["backups"]] == ids[2:], listed
    code, out, err = cli("backup", "prune", dest, "--keep-within", "soon")
    assert code == 2 and "is not a duration" in err and "7d" in err, err
