"""Checkpoint backups: incremental, content-addressed, verified, online, relocatable (no Dagster here).

    from checkpoint_ops.backup import Repository, create_backup, verify_backups, plan_restore, restore_backup

    summary = create_backup("s3://bucket/checkpoints/events", "s3://bucket/backups/events",
                            sink_urls=["s3://bucket/tables/events"])
    repo = Repository.open("s3://bucket/backups/events")
    verify_backups(repo, summary["backup_id"])
    rp = plan_restore(repo, summary["backup_id"], "/restore/ckpt", sink_targets=["/restore/out"],
                      relocate=["s3://bucket/landing=/restore/in"], stage=True)
    restore_backup(rp, repo)
"""

from .create import create_backup
from .repository import Manifest, Repository
from .restore import RestorePlan, plan_restore, restore_backup
from .retention import apply_backup_prune, plan_backup_prune
from .verify import verify_backups


def list_backups(repo: Repository) -> list[dict]:
    """Every backup at a destination, oldest first, with what it holds, its last verification and its last
    restore drill."""
    verified = repo.verified()
    drills = repo.drills()
    out = []
    for m in repo.manifests():
        v = verified.get(m.id)
        out.append({"id": m.id, "created": m.created, "kind": m.doc.get("kind"), "checkpoint": m.checkpoint_url,
                    "query_id": m.doc["checkpoint"].get("query_id"), "batch": m.batch,
                    "files": m.stats.get("files"), "bytes": m.stats.get("bytes"),
                    "new_bytes": m.stats.get("new_bytes"), "new_objects": m.stats.get("new_objects"),
                    "verified": (v.get("at") if v.get("ok") else "FAILED") if v else None,
                    "drill": ({"at": drills[m.id].get("drilled_at"), "passed": bool(drills[m.id].get("passed"))}
                              if drills.get(m.id) else None)})
    return out


__all__ = ["Manifest", "Repository", "RestorePlan", "apply_backup_prune", "create_backup", "list_backups",
           "plan_backup_prune", "plan_restore", "restore_backup", "verify_backups"]
