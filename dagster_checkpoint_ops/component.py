"""``StreamingQueryComponent``: one streaming query configured in a ``defs.yaml``, built on the factory.

.. code-block:: yaml

    type: dagster_checkpoint_ops.StreamingQueryComponent
    attributes:
      name: my_stream
      query: "query:build"            # module:function; a module beside this defs.yaml, or any importable one
      checkpoint: my_stream/checkpoint  # relative: under the checkpoint-ops home; or an absolute path, s3://...
      sinks: [my_stream/output]
      spark_config: {spark.sql.shuffle.partitions: "8"}
      schedule: "*/5 * * * *"          # or automation_condition: "{{ automation_condition.on_cron('*/5 * * * *') }}"
      backup_url: s3://backups/streams/my_stream
      retention: 30d

Without ``query`` the query runs elsewhere: an external asset whose checkpoint is observed, checked, backed up
and compacted. ``dg scaffold defs dagster_checkpoint_ops.StreamingQueryComponent my_stream`` writes a
``defs.yaml`` like this one and a ``query.py`` stub. The shared jobs of each component are named after its
query (``my_stream_checkpoint_backup_job``...), so several components and Python definitions sit side by side.
"""

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import dagster as dg
from dagster.components.component_scaffolding import scaffold_component

from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.streaming import default_home, streaming_definitions


class StreamingQueryScaffolder(dg.Scaffolder):
    """Writes ``defs.yaml`` (a working query on local directories under the home) and ``query.py``."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = request.target_path.name.replace("-", "_")
        if not name.isidentifier():
            name = "my_stream"
        scaffold_component(request, {
            "name": name,
            "query": "query:build",
            "checkpoint": f"{name}/checkpoint",
            "sinks": [f"{name}/output"],
            "schedule": "*/5 * * * *",
        })
        (request.target_path / "query.py").write_text(QUERY_STUB.format(name=name))


QUERY_STUB = '''"""The streaming query of {name} (defs.yaml: query: "query:build"). Edit build(); keep it unstarted."""

import os

from dagster_checkpoint_ops import default_home

INPUT = os.path.join(default_home(), "{name}", "incoming")  # JSON files with "key" and "value" arrive here
OUTPUT = os.path.join(default_home(), "{name}", "output")  # defs.yaml's sink: {name}/output, under the home


def build(spark):
    """The query's unstarted DataStreamWriter: the asset adds the checkpoint and Trigger.AvailableNow."""
    os.makedirs(INPUT, exist_ok=True)
    events = spark.readStream.schema("key STRING, value LONG").json(INPUT)
    return events.writeStream.format("parquet").option("path", OUTPUT)
'''


def under_home(location: str) -> str:
    """A location as given, or a relative path under the checkpoint-ops home (``default_home()``)."""
    if "://" in location or os.path.isabs(location):
        return location
    return os.path.join(default_home(), location)


@dg.scaffold_with(StreamingQueryScaffolder)
@dataclass
class StreamingQueryComponent(dg.Component, dg.Resolvable):
    """A Spark Structured Streaming query as a Dagster asset, with its checkpoint's health check, backups,
    sink compaction, undo and restore jobs (``streaming_definitions`` for one query)."""

    name: str
    checkpoint: str
    query: Optional[str] = None
    sinks: list[str] = field(default_factory=list)
    description: Optional[str] = None
    group: str = "streaming"
    spark_config: dict[str, Any] = field(default_factory=dict)  # runtime Spark settings for this query
    schedule: Optional[str] = None
    automation_condition: Annotated[
        Optional[dg.AutomationCondition],
        dg.Resolver.default(model_field_type=Optional[str],
                            description="When to run, e.g. {{ automation_condition.on_cron('*/5 * * * *') }}"),
    ] = None
    backup_url: Optional[str] = None
    retention: Optional[str] = None

    def load_query(self, context: dg.ComponentLoadContext) -> Optional[Callable]:
        """``query: "module:function"``: a module file beside the defs.yaml, else an importable module."""
        if self.query is None:
            return None
        module_name, sep, function = self.query.partition(":")
        if not sep or not module_name or not function:
            raise ValueError(f"{self.name}: query {self.query!r} is not module:function (e.g. query:build)")
        local = Path(context.path) / (module_name.replace(".", "/") + ".py")
        module = context.load_defs_relative_python_module(local) if local.exists() \
            else importlib.import_module(module_name)
        build = getattr(module, function, None)
        if not callable(build):
            raise ValueError(f"{self.name}: {module.__name__} has no function {function!r} (query: {self.query})")
        return build

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        query = StreamingQuery(name=self.name, build=self.load_query(context), checkpoint=under_home(self.checkpoint),
                               sinks=[under_home(s) for s in self.sinks], description=self.description,
                               group=self.group, spark_config={k: str(v) for k, v in self.spark_config.items()},
                               schedule=self.schedule,
                               automation_condition=self.automation_condition,
                               backup_url=under_home(self.backup_url) if self.backup_url else None,
                               sink_retention=self.retention)
        return streaming_definitions([query], scope=self.name)
