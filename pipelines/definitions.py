"""The example code location, built only with the factory: JSON events arriving in a directory feed
``events_stream`` (the events as parquet) and ``event_counts`` (windowed counts, RocksDB state with
checkpoint format V2), each with its own checkpoint under ``<home>/example/``."""

import os

from dagster_checkpoint_ops import StreamingQuery, default_home, streaming_definitions
from pipelines.event_counts import ROCKSDB_V2, counts_writer, events_writer
from resources import EXAMPLE_SPARK_CONFIG

HOME = default_home()
EXAMPLE = os.path.join(HOME, "example")
EVENTS_IN = os.path.join(EXAMPLE, "incoming")  # where JSON event files arrive
EVENTS_OUT = os.path.join(EXAMPLE, "events")
COUNTS_OUT = os.path.join(EXAMPLE, "event_counts")
# `make ui` drains new events every five minutes; EXAMPLE_EVENTS_SCHEDULE="" turns the schedule off (the UI
# smoke test runs the stream itself and must not race a scheduled run)
EVENTS_SCHEDULE = os.environ.get("EXAMPLE_EVENTS_SCHEDULE", "*/5 * * * *")


def build_events(spark):
    return events_writer(spark, EVENTS_IN, EVENTS_OUT)


def build_counts(spark):
    return counts_writer(spark, EVENTS_IN, COUNTS_OUT)


events_stream = StreamingQuery(name="events_stream", build=build_events,
                               checkpoint=os.path.join(EXAMPLE, "checkpoints", "events_stream"), sinks=[EVENTS_OUT],
                               schedule=EVENTS_SCHEDULE or None,
                               description="Incoming JSON events, as parquet (stateless file sink).")
# the state store settings are the query's own (recorded in the checkpoint by its first batch), set for its
# runs only: set on the shared session in build(), they would leak into events_stream's runs
event_counts = StreamingQuery(name="event_counts", build=build_counts, spark_config=ROCKSDB_V2,
                              checkpoint=os.path.join(EXAMPLE, "checkpoints", "event_counts"), sinks=[COUNTS_OUT],
                              description="Events counted and summed per 30-second window and key (RocksDB state).")

defs = streaming_definitions([events_stream, event_counts], home=HOME, spark_config=EXAMPLE_SPARK_CONFIG)
