"""The user's own settings: where their data lives."""

import os
from pathlib import Path


def data_dir() -> Path:
    return Path(os.environ.get("USER_DATA_DIR", ".user-data")).resolve()
