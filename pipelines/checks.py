"""Checkpoint health as asset checks."""

import dagster as dg

from checkpoint_ops.fsck import run_fsck
from pipelines.assets import event_counts
from resources.checkpoint_files import CheckpointFileManagerResource
from resources.streams import StreamLocations


@dg.asset_check(asset=event_counts, blocking=False)
def event_counts_checkpoint_check(
    locations: StreamLocations, checkpoint_files: CheckpointFileManagerResource
) -> dg.AssetCheckResult:
    """fsck of the checkpoint and sink: nothing that would break a restart or lose data."""
    ckpt = checkpoint_files.checkpoint(locations.checkpoint_dir)
    sink = checkpoint_files.sink(locations.output_dir)
    findings = run_fsck(ckpt, [sink])
    errors = [f for f in findings if f.severity == "error"]
    return dg.AssetCheckResult(
        passed=not errors,
        severity=dg.AssetCheckSeverity.ERROR if errors else dg.AssetCheckSeverity.WARN,
        description=f"{len(findings)} finding(s), {len(errors)} error(s)" if findings else "healthy",
        metadata={
            "findings": dg.MetadataValue.json([f.to_dict() for f in findings]),
            "errors": dg.MetadataValue.int(len(errors)),
            "warnings": dg.MetadataValue.int(len(findings) - len(errors)),
        },
    )
