"""A streaming query as the Dagster definitions know it, and the names derived from it."""

import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class StreamingQuery:
    """One streaming query: its name (the asset's), how to build it, its checkpoint and file sinks.

    ``build(spark)`` returns the query's unstarted ``DataStreamWriter``; ``sinks`` are the output
    directories of its file sinks (empty for foreachBatch, Kafka and other sinks). ``build=None`` is a
    query that runs elsewhere (continuously, another scheduler): its asset is external, its checkpoint
    still gets the health check, backups, compaction, a rollback job and a progress sensor.

    How it runs (a built query only; at most one of ``schedule`` and ``automation_condition``):
    ``schedule`` is a cron string for a schedule of its job (``"*/5 * * * *"``), ``automation_condition``
    a ``dg.AutomationCondition`` on its asset; ``spark_config`` holds runtime Spark settings applied to the
    session for this query's runs only, over the shared ones; ``freshness_policy`` a ``dg.FreshnessPolicy``.
    """

    name: str
    build: Optional[Callable]  # (SparkSession) -> DataStreamWriter, not started; None: the query runs elsewhere
    checkpoint: str
    sinks: Sequence[str] = ()
    description: Optional[str] = None
    group: str = "streaming"
    tags: dict = field(default_factory=dict)
    spark_config: dict = field(default_factory=dict)
    schedule: Optional[str] = None
    automation_condition: Optional[object] = None  # dg.AutomationCondition
    freshness_policy: Optional[object] = None  # dg.FreshnessPolicy
    backup_url: Optional[str] = None  # this query's backups (default: <the definitions' backup_url>/<name>)
    sink_retention: Optional[str] = None  # its compaction also drops sink batches older than this (default: shared)

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"query name {self.name!r} must be a Python identifier (it names the asset and its ops)")
        if isinstance(self.sinks, str):
            raise ValueError(f"query {self.name}: sinks must be a list of output directories, not the string "
                             f"{self.sinks!r} (write sinks=[{self.sinks!r}])")
        relative = [(what, url) for what, url in [("checkpoint", self.checkpoint), *(("sinks", u) for u in self.sinks),
                                                   ("backup_url", self.backup_url)]
                    if isinstance(url, str) and not _absolute(url)]
        if relative:
            what, url = relative[0]
            raise ValueError(
                f"query {self.name}: {what} {url!r} is a relative path, which each process resolves against its own "
                "current directory: a run started from another directory would start a new checkpoint (and process "
                "all of its input again) or write another output. Give an absolute path or a URL (s3://...), e.g. "
                f"os.path.join(default_home(), {url!r}) for a place under the checkpoint-ops home, as a YAML "
                "component's relative paths are")
        if self.schedule and self.automation_condition is not None:
            raise ValueError(f"query {self.name}: give a schedule or an automation_condition, not both")
        if self.build is None and (self.schedule or self.automation_condition is not None or self.spark_config):
            raise ValueError(f"query {self.name} runs elsewhere (build=None): schedule, automation_condition and "
                             "spark_config apply only to a query these definitions run")

    @property
    def external(self) -> bool:
        """The query runs elsewhere: these definitions observe and operate its checkpoint, never run it."""
        return self.build is None


def _absolute(url: str) -> bool:
    """An absolute local path, or a URL with a scheme (``s3://``, ``file:/``)."""
    return url.startswith("/") or bool(re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", url))


def pool_name(query: str) -> str:
    """One Dagster pool per checkpoint: its streaming runs, backups and compactions never overlap."""
    return f"checkpoint-{query}"


def job_name(query: str) -> str:
    return f"{query}_job"


def schedule_name(query: str) -> str:
    return f"{query}_schedule"


def rollback_job_name(query: str) -> str:
    """The rollback job of a query that runs elsewhere (a built query rolls back through its asset's run config)."""
    return f"{query}_rollback_job"
