"""Short steps a first Ctrl-C must not cut in half: ``interrupts_held`` holds it back until the step is done.

A lease written but not yet known to its holder, or one half released, is left for others to wait out (its
heartbeat stops, so it goes stale); holding a first interrupt for the few requests such a step makes avoids
that. A second interrupt stops at once, as usual: a person who means it is never held.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Callable


@contextlib.contextmanager
def interrupts_held(on_hold: Callable[[], None] | None = None):
    """Within it, a first interrupt (SIGINT, Ctrl-C) is held back and recorded in the list it yields (``on_hold``
    called then); a second one stops at once, as usual. For short steps that must not stop half-way (a lease's
    release). It holds nothing outside the main thread (where Python delivers no signal), nor where SIGINT is not
    Python's own KeyboardInterrupt: ignored (a job started in the background), or handled by the caller (a Dagster
    run); nor in a cleanup that a Ctrl-C started (handling its KeyboardInterrupt): the person pressed once already,
    and the next press stops at once, as the message of the first hold promised."""
    caught: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            or isinstance(sys.exc_info()[1], KeyboardInterrupt)):  # a cleanup after a Ctrl-C: the next one stops it
        yield caught
        return

    def hold(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signum)
        if on_hold is not None:
            on_hold()

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)
