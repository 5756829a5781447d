"""Batch ids read from file names (``model/listing.py``, ``model/logfile.py``): the fast path for the names Spark
writes gives exactly the answers of the rule as stated (Java's ``toLong`` on UTF-16 units), on every kind of name."""

from __future__ import annotations

import itertools

import pytest

from checkpoint_ops.model.listing import Listing, listed_batch_id, misnamed_batch_id, spark_batch_id
from checkpoint_ops.model.logfile import batch_id_from_name, misnamed_log_files
from checkpoint_ops.storage import FileInfo

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def java_to_long(name: str) -> int | None:
    """The rule, written out: an optional ``-``, then one or more decimal digits each of one UTF-16 unit, the value
    within a long. (A leading ``+`` is ``listed_batch_id``'s.)"""
    digits = name[1:] if name[:1] == "-" else name
    if not digits or not all(ch.isdecimal() and ord(ch) < 0x10000 for ch in digits):
        return None
    value = int(name)
    return value if LONG_MIN <= value <= LONG_MAX else None


NAMES = ["", "-", "+", "--1", "-+1", "+-1", "0", "-0", "00", "031", "+31", "+0", "7", "-7", "12345", " 1", "1 ",
         "1.compact", "1e3", "0x10", "١٢", "²", "𝟑", "1𝟑", "-٣", "٣1", "9" * 18, "9" * 19, "1" + "0" * 18,
         str(LONG_MAX), str(LONG_MAX + 1), str(LONG_MIN), str(LONG_MIN - 1), "-" + "9" * 18, "-" + "9" * 19,
         "0" * 30 + "5", "-0" + "0" * 25, "10000", "10000.compact", ".10000.crc", "_spark_metadata", "metadata"]


@pytest.mark.parametrize("name", NAMES + [a + b for a, b in itertools.product(["", "-", "+", "0"], ["1", "٣", "²"])])
def test_the_fast_path_reads_every_name_as_the_rule_does(name):
    assert spark_batch_id(name) == java_to_long(name)
    plus = java_to_long(name[1:]) if name[:1] == "+" and name[1:2] != "-" else java_to_long(name)
    assert listed_batch_id(name) == plus
    assert misnamed_batch_id(name) == (plus if plus is not None and str(plus) != name else None)
    assert batch_id_from_name(name) == (plus if plus is not None and str(plus) == name and name[:1] != "+" else None)


def test_misnamed_entries_are_named_in_order_with_the_oldest_kept_batch():
    names = ["12", "3", "031", "+5", "٣", "0002", "20.compact", "019.compact", "2", "notes", ".3.crc", "-0"]
    listing = Listing(None, "/ck", [FileInfo(f"/ck/offsets/{n}", 1, 1.0) for n in names])
    got = [(e.rel, e.batch, e.oldest_kept) for e in misnamed_log_files(listing, "offsets")]
    # kept: 12, 3, 2 (oldest 2); "-0" is batch 0, below it; "20.compact" is no batch name where logs do not compact
    assert got == [("offsets/+5", 5, None), ("offsets/-0", 0, 2), ("offsets/0002", 2, None), ("offsets/031", 31, None),
                   ("offsets/٣", 3, None)]
    compact = [(e.rel, e.batch, e.oldest_kept) for e in misnamed_log_files(listing, "offsets", compactible=True)]
    assert compact == [("offsets/+5", 5, None), ("offsets/-0", 0, 2), ("offsets/0002", 2, None),
                       ("offsets/019.compact", 19, None), ("offsets/031", 31, None), ("offsets/٣", 3, None)]
