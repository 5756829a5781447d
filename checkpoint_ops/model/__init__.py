"""Read-only model of what Spark writes: checkpoint logs, state stores, source and sink logs."""

from .checkpoint import Checkpoint, open_sink
from .commits import CommitMetadata
from .compactible import CompactibleLog, LogEntry
from .listing import Listing
from .logfile import LogFormatError
from .offsets import OffsetSeq, SourceOffset
from .sink import SinkOutput
from .state import StateModel

__all__ = [
    "Checkpoint",
    "CommitMetadata",
    "CompactibleLog",
    "Listing",
    "LogEntry",
    "LogFormatError",
    "OffsetSeq",
    "SinkOutput",
    "SourceOffset",
    "StateModel",
    "open_sink",
]
