"""The user's streaming query, defined in Python."""

from resources.settings import data_dir

SCHEMA = "key STRING, value LONG"


def clicks_paths() -> dict:
    base = data_dir() / "clicks"
    return {"incoming": str(base / "incoming"), "checkpoint": str(base / "checkpoint"), "output": str(base / "output")}


def build_clicks(spark):
    paths = clicks_paths()
    return spark.readStream.schema(SCHEMA).json(paths["incoming"]).writeStream.format("parquet").option(
        "path", paths["output"])
