"""The atomic checkpoint file manager as a Dagster resource."""

from typing import Optional

import dagster as dg
from pydantic import Field

from checkpoint_ops.ledger import Ledger
from checkpoint_ops.model import Checkpoint, SinkOutput, open_sink
from checkpoint_ops.storage import CheckpointFileManager, open_file_manager


class CheckpointFileManagerResource(dg.ConfigurableResource):
    """Reads and writes Spark checkpoints through the atomic checkpoint file manager.

    The strategy follows the URL scheme (temp-then-rename on local disk and HDFS, conditional
    direct put on S3/GCS/Azure) unless ``strategy`` names one. Credentials belong in ``EnvVar`` fields
    (or the environment): they are passed to the storage client and shown nowhere.

    Examples:
        .. code-block:: python

            @dg.asset
            def checkpoint_summary(checkpoint_files: CheckpointFileManagerResource):
                ckpt = checkpoint_files.checkpoint("s3://bucket/checkpoints/events")
                return ckpt.latest_commit

            defs = dg.Definitions(
                assets=[checkpoint_summary],
                resources={"checkpoint_files": CheckpointFileManagerResource(
                    endpoint_url=dg.EnvVar("AWS_ENDPOINT_URL"),
                    key=dg.EnvVar("AWS_ACCESS_KEY_ID"), secret=dg.EnvVar("AWS_SECRET_ACCESS_KEY"))},
            )
    """

    storage_options: dict = Field(
        default={},
        description="fsspec storage options without secrets (e.g. region, anon). S3 also honours AWS_ENDPOINT_URL.",
    )
    endpoint_url: Optional[str] = Field(default=None, description="Object-store endpoint (S3-compatible servers).")
    key: Optional[str] = Field(default=None, description="Object-store access key id: use dg.EnvVar.")
    secret: Optional[str] = Field(default=None, description="Object-store secret key: use dg.EnvVar (never shown).")
    strategy: Optional[str] = Field(
        default=None,
        description="Force a file manager strategy: 'local-rename', 'rename' (HDFS-like) or 'direct-put' "
        "(object stores). Default: chosen by URL scheme.",
    )

    def options(self) -> Optional[dict]:
        """The storage options to pass on (credentials included, for the storage client only)."""
        opts = dict(self.storage_options or {})
        for name in ("endpoint_url", "key", "secret"):
            if getattr(self, name):
                opts[name] = getattr(self, name)
        return opts or None

    def file_manager(self, url: str) -> tuple[CheckpointFileManager, str]:
        """The file manager for ``url`` and the fsspec path of ``url``."""
        return open_file_manager(url, self.options(), self.strategy)

    def checkpoint(self, url: str) -> Checkpoint:
        """The read-only model of the checkpoint at ``url``."""
        fm, root = self.file_manager(url)
        ckpt = Checkpoint(fm, root)
        ckpt.require_checkpoint(url)
        return ckpt

    def sink(self, url: str) -> SinkOutput:
        """The read-only model of a file sink's output directory."""
        return open_sink(url, self.options())

    def ledger(self, ckpt: Checkpoint) -> Ledger:
        """The batch ledger beside a checkpoint."""
        return Ledger.for_checkpoint(ckpt)
