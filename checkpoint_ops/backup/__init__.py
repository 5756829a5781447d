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
from .listing import BackupRow, list_backups
from .repository import DamagedManifest, Manifest, Repository
from .restore import RestorePlan, plan_restore, restore_backup
from .retention import BackupPruneResult, apply_backup_prune, plan_backup_prune
from .verify import Verification, verify_backups

__all__ = ["BackupPruneResult", "BackupRow", "DamagedManifest", "Manifest", "Repository", "RestorePlan",
           "Verification", "apply_backup_prune", "create_backup", "list_backups", "plan_backup_prune", "plan_restore",
           "restore_backup", "verify_backups"]
