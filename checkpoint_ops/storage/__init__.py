"""Storage: the atomic checkpoint file manager and its strategies."""

from .manager import AtomicWriter, CheckpointFileManager, FileChangedError, FileInfo, OpCounter
from .paths import Location, parse_url
from .registry import open_file_manager, register_strategy

__all__ = [
    "AtomicWriter",
    "CheckpointFileManager",
    "FileChangedError",
    "FileInfo",
    "Location",
    "OpCounter",
    "open_file_manager",
    "parse_url",
    "register_strategy",
]
