"""`checkpoint-ops offsets --batch N` beside a damaged commit (fast tier, no Spark)."""

from __future__ import annotations

import os

from benchmarks import synthetic
from tests.helpers import cli, cli_json, tree_snapshot


def test_offsets_of_a_batch_whose_commit_is_torn_are_shown_with_the_damage(tmp_path):
    """A torn `commits/N` (a write cut mid-record) made `offsets --batch N` exit 2 with the parse error alone, though
    `offsets/N` is whole and is what on call asks for to decide where to roll back to. The offsets are shown, the
    damaged commit beside them with its fix, and the exit code is 1 (findings); nothing changes."""
    ck = str(tmp_path / "ck")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    whole = open(f"{ck}/commits/11", "rb").read()
    with open(f"{ck}/commits/11", "wb") as f:
        f.write(whole[:20])
    os.remove(f"{ck}/commits/.11.crc")
    before = tree_snapshot(ck)

    code, r = cli_json("offsets", ck, "--batch", "11")
    assert code == 1, r
    assert r["committed"] is True and [s["end"] for s in r["sources"]] == [{"logOffset": 11}], r
    assert r["commit_problem"]["path"] == f"{ck}/commits/11" and "ends mid-record" in r["commit_problem"]["problem"], r
    assert "rollback" in r["commit_problem"]["fix"], r
    code, out, err = cli("offsets", ck, "--batch", "11")
    assert code == 1, err
    assert "to {'logOffset': 11}" in out and f"its commit is damaged: {ck}/commits/11: ends mid-record" in out, out
    assert "fix:" in out

    code, r = cli_json("offsets", ck, "--batch", "10")  # its neighbours as before
    assert code == 0 and r["committed"] is True and r["commit_problem"] is None, r
    assert tree_snapshot(ck) == before


def test_offsets_of_a_batch_whose_start_is_torn_are_shown_with_the_damage(tmp_path):
    """A torn `offsets/N-1` (where batch N started) made `offsets --batch N` exit 2 with the parse error alone, though
    `offsets/N` is whole: where the batch ended is shown, its start as unknown with the damaged file named beside it
    and its fix, exit 1 (findings); nothing changes."""
    ck = str(tmp_path / "ck")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    whole = open(f"{ck}/offsets/10", "rb").read()
    with open(f"{ck}/offsets/10", "wb") as f:
        f.write(whole[: len(whole) // 2])
    os.remove(f"{ck}/offsets/.10.crc")
    before = tree_snapshot(ck)

    code, r = cli_json("offsets", ck, "--batch", "11")
    assert code == 1, r
    assert r["start_known"] is False and r["commit_problem"] is None, r
    assert [(s["start"], s["end"]) for s in r["sources"]] == [(None, {"logOffset": 11})], r
    assert r["start_problem"]["path"] == f"{ck}/offsets/10" and r["start_problem"]["fix"], r
    code, out, err = cli("offsets", ck, "--batch", "11")
    assert code == 1, err
    assert "from (unknown: below) to {'logOffset': 11}" in out, out
    assert f"where it started is unknown: {ck}/offsets/10: " in out and "fix:" in out, out

    code, r = cli_json("offsets", ck, "--batch", "9")  # a batch before it, whose own start is whole
    assert code == 0 and r["start_problem"] is None, r
    assert tree_snapshot(ck) == before


def _torn_start(ck: str, data: bytes) -> None:
    with open(f"{ck}/offsets/10", "wb") as f:
        f.write(data)
    if os.path.exists(f"{ck}/offsets/.10.crc"):
        os.remove(f"{ck}/offsets/.10.crc")


def test_a_start_torn_before_its_sources_is_named_not_shown_as_null(tmp_path):
    """`offsets/N-1` cut to its version line, or to its metadata line (no source line): the first parsed as no
    sources at all, the second is what Spark reads as a batch with no sources; both were shown as a start of None,
    exit 0, while fsck calls them damage. Both are named, exit 1."""
    ck = str(tmp_path / "ck")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    whole = open(f"{ck}/offsets/10", "rb").read()
    version, metadata, _ = whole.split(b"\n", 2)
    for torn, says in ((version + b"\n", "no metadata line"), (version + b"\n" + metadata, "lists 0 sources")):
        _torn_start(ck, torn)
        code, r = cli_json("offsets", ck, "--batch", "11")
        assert code == 1 and r["start_known"] is False, (torn, r)
        assert r["start_problem"]["path"] == f"{ck}/offsets/10" and says in r["start_problem"]["problem"], r
        assert r["start_problem"]["fix"], r


def test_the_ledger_answers_where_a_damaged_or_missing_start_began(tmp_path):
    """The batch ledger recorded `offsets/N-1`: when the file is then torn, or missing in the middle of the log,
    the start comes from the ledger, and what is wrong on disk is named beside it (exit 1). A gap without a
    ledger was shown as "purged" with exit 0."""
    ck = str(tmp_path / "ck")
    synthetic.write_local(ck, batches=12, partitions=2, retain_state=20)
    code, r = cli_json("offsets", ck, "--batch", "11")
    assert code == 0 and r["start_known"] and r["start_problem"] is None, r
    start = [s["start"] for s in r["sources"]]
    whole = open(f"{ck}/offsets/10", "rb").read()

    os.remove(f"{ck}/offsets/10")  # a gap: offsets/0..9 remain
    os.remove(f"{ck}/offsets/.10.crc")
    code, r = cli_json("offsets", ck, "--batch", "11")
    assert code == 1 and r["start_known"] is False and "gap" in r["start_problem"]["problem"], r
    code, out, _ = cli("offsets", ck, "--batch", "11")
    assert "purged" not in out and "where it started is unknown" in out, out

    with open(f"{ck}/offsets/10", "wb") as f:
        f.write(whole)
    code, r = cli_json("ledger", "sync", ck)
    assert code == 0, r
    _torn_start(ck, whole[: len(whole) // 2])
    code, r = cli_json("offsets", ck, "--batch", "11")
    assert code == 1 and r["start_known"] is True and [s["start"] for s in r["sources"]] == start, r
    assert r["start_problem"]["path"] == f"{ck}/offsets/10", r
