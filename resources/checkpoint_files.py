"""The atomic checkpoint file manager as a Dagster resource."""

from typing import Optional

import dagster as dg
from pydantic import Field

from checkpoint_ops.model import Checkpoint, SinkOutput, open_sink
from checkpoint_ops.storage import CheckpointFileManager, open_file_manager


class CheckpointFileManagerResource(dg.ConfigurableResource):
    """Reads and writes Spark checkpoints through the atomic checkpoint file manager.

    The strategy follows the URL scheme (temp-then-rename on local disk and HDFS, conditional
    direct put on S3/GCS/Azure) unless ``strategy`` names one.

    Examples:
        .. code-block:: python

            @dg.asset
            def checkpoint_summary(checkpoint_files: CheckpointFileManagerResource):
                ckpt = checkpoint_files.checkpoint("s3://bucket/checkpoints/events")
                return ckpt.latest_commit

            defs = dg.Definitions(
                assets=[checkpoint_summary],
                resources={"checkpoint_files": CheckpointFileManagerResource(
                    storage_options={"endpoint_url": dg.EnvVar("AWS_ENDPOINT_URL")})},
            )
    """

    storage_options: dict = Field(
        default={},
        description="fsspec storage options (e.g. endpoint_url, key, secret). S3 also honours AWS_ENDPOINT_URL.",
    )
    strategy: Optional[str] = Field(
        default=None,
        description="Force a file manager strategy: 'local-rename', 'rename' (HDFS-like) or 'direct-put' "
        "(object stores). Default: chosen by URL scheme.",
    )

    def file_manager(self, url: str) -> tuple[CheckpointFileManager, str]:
        """The file manager for ``url`` and the fsspec path of ``url``."""
        return open_file_manager(url, self.storage_options or None, self.strategy)

    def checkpoint(self, url: str) -> Checkpoint:
        """The read-only model of the checkpoint at ``url``."""
        fm, root = self.file_manager(url)
        ckpt = Checkpoint(fm, root)
        ckpt.require_checkpoint(url)
        return ckpt

    def sink(self, url: str) -> SinkOutput:
        """The read-only model of a file sink's output directory."""
        return open_sink(url, self.storage_options or None)
