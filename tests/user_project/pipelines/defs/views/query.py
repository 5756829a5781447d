"""The `views` query of defs.yaml (query: "query:build")."""

import os

from dagster_checkpoint_ops import default_home

INPUT = os.path.join(default_home(), "views", "incoming")
OUTPUT = os.path.join(default_home(), "views", "output")


def build(spark):
    return spark.readStream.schema("key STRING, value LONG").json(INPUT).writeStream.format("parquet").option(
        "path", OUTPUT)
