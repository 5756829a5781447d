"""The user's code location: `clicks` from Python, and every component under pipelines/defs/ (`views` is a
dagster_checkpoint_ops.StreamingQueryComponent in a defs.yaml)."""

from pathlib import Path

import dagster as dg

from dagster_checkpoint_ops import StreamingQuery, streaming_definitions
from pipelines.queries import build_clicks, clicks_paths

paths = clicks_paths()
clicks = StreamingQuery(name="clicks", build=build_clicks, checkpoint=paths["checkpoint"], sinks=[paths["output"]],
                        schedule="*/5 * * * *")

defs = dg.Definitions.merge(streaming_definitions([clicks]),
                            dg.load_from_defs_folder(path_within_project=Path(__file__).parent))
