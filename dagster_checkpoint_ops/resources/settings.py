"""Where the streaming definitions keep their working files and backups, and how often they act."""

from typing import Optional

import dagster as dg
from pydantic import Field


class StreamingSettings(dg.ConfigurableResource):
    """Working directory, backup destination and housekeeping policy of the streaming definitions.

    Examples:
        .. code-block:: python

            StreamingSettings(home="/var/lib/checkpoint-ops", backup_url="s3://backups/streams",
                              backup_keep_last=48, backup_max_age="2h", sink_retention="30d")
    """

    home: str = Field(description="Working directory: reprocessing requests (reprocess-requests/), and the "
                      "default place of backups.")
    backup_url: str = Field(description="Where backups go; each query's under <backup_url>/<query name>.")
    backup_keep_last: int = Field(default=24, description="Backups kept per query by the backup job's prune (the "
                                  "newest verified one is always kept).")
    backup_max_age: str = Field(default="2h", description="backup_freshness_check fails when a query's newest "
                                "verified backup is older than this (e.g. 90m, 2h, 1d).")
    sink_retention: Optional[str] = Field(default=None, description="The compaction job also drops sink batches "
                                          "older than this (e.g. 30d); unset: compaction only.")

    def backup_dest(self, query: str) -> str:
        return f"{self.backup_url.rstrip('/')}/{query}"

    def backup_dest_of(self, query) -> str:
        """Where a ``StreamingQuery``'s backups go: its own ``backup_url`` if set, else ``<backup_url>/<name>``."""
        return query.backup_url or self.backup_dest(query.name)

    def sink_retention_of(self, query) -> Optional[str]:
        """A query's own ``sink_retention`` if set, else the shared one."""
        return query.sink_retention or self.sink_retention

    @property
    def requests_dir(self) -> str:
        return f"{self.home.rstrip('/')}/reprocess-requests"
