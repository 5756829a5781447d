"""Where a streaming query keeps its input, checkpoint and output."""

import os

import dagster as dg
from pydantic import Field

DEMO_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_data")


class StreamLocations(dg.ConfigurableResource):
    """Input, checkpoint and output locations of one streaming query (defaults: ``demo_data/``).

    Examples:
        .. code-block:: python

            StreamLocations(
                input_dir="/data/events/in",
                checkpoint_dir="/data/events/checkpoint",
                output_dir="/data/events/counts",
            )
    """

    input_dir: str = Field(default=os.path.join(DEMO_ROOT, "input"), description="Directory the file source reads.")
    checkpoint_dir: str = Field(
        default=os.path.join(DEMO_ROOT, "checkpoint"), description="The query's checkpointLocation."
    )
    output_dir: str = Field(
        default=os.path.join(DEMO_ROOT, "output"), description="The file sink's output directory (with _spark_metadata)."
    )
