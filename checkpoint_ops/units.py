"""Times and durations as people type them, one parser each for the CLI and the Dagster layer.

Each parser takes ``what``: the flag or run-config key the text came from, so a refusal names what the
user actually typed (``--older-than`` on the command line, ``rollback_to_time`` in the launchpad).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from .errors import BadInputError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in ``30s``, ``15m``, ``12h``, ``7d``, ``2w``. The unit is required: a bare number has
    meant days to some commands and seconds to others."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not m:
        hint = (f" (a bare number is ambiguous: write {text.strip()}d for days or {text.strip()}s for seconds)"
                if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text or "") else "")
        raise BadInputError(f"{what} {text!r} is not a duration{hint}", fix="write it like 30s, 15m, 12h, 7d or 2w")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_time(text: str, what: str = "time") -> datetime:
    """An ISO 8601 time; one without an offset is UTC."""
    try:
        t = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise BadInputError(f"{what} {text!r} is not an ISO 8601 time",
                            fix=f"e.g. {what} 2026-11-21T06:30:00Z (a time without offset is taken as UTC)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def iso_ms(ms: int | float | None) -> str | None:
    """Epoch milliseconds as an ISO 8601 UTC time (seconds resolution), as every message shows times."""
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))
