"""One checkpoint, one query (``checkpoint_ops.query_owner``): the first query that runs a checkpoint is recorded
beside it, another name is answered with the recorded owner and nothing written; a record made for another
location (a copy) or one that cannot be read says nothing and is replaced. Local and on the S3 server."""

from __future__ import annotations

import json
import os

import pytest

from checkpoint_ops.errors import BadInputError
from checkpoint_ops.query_owner import claim, owner_path
from checkpoint_ops.storage import open_file_manager


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path):
    """(file manager, checkpoint root, root of a copy) on the file system or the S3 server."""
    if request.param == "local":
        fm, root = open_file_manager(str(tmp_path / "q" / "checkpoint"))
        return fm, root, str(tmp_path / "copy" / "checkpoint")
    s3_server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
    fm, root = open_file_manager(f"s3://{bucket}/q/checkpoint", {"endpoint_url": s3_server})
    return fm, root, f"{bucket}/copy/checkpoint"


def test_the_first_query_claims_and_another_is_answered_with_it(location):
    fm, root, _ = location
    first = claim(fm, root, "events_a", "run 1")
    assert first.other is None and first.note is None
    recorded = fm.read_bytes(first.path)
    assert json.loads(recorded)["name"] == "events_a"

    again = claim(fm, root, "events_a", "run 2")
    assert again.other is None and again.note is None
    assert fm.read_bytes(first.path) == recorded  # not written again

    other = claim(fm, root, "events_b", "run 3")
    assert other.other is not None and other.other.name == "events_a" and other.other.by == "run 1"
    assert fm.read_bytes(first.path) == recorded  # the refused query wrote nothing


def test_a_dry_run_judges_without_writing(location):
    fm, root, _ = location
    assert claim(fm, root, "events_a", "dry run", write=False).other is None
    assert not fm.exists(owner_path(fm, root))
    claim(fm, root, "events_a", "run 1")
    assert claim(fm, root, "events_b", "dry run", write=False).other.name == "events_a"


def test_a_record_copied_with_the_checkpoint_says_nothing_about_the_copy(location):
    fm, root, copy = location
    claim(fm, root, "events_a", "run 1")
    fm.write_bytes(owner_path(fm, copy), fm.read_bytes(owner_path(fm, root)))
    got = claim(fm, copy, "events_b", "run 2")
    assert got.other is None and "(a copy)" in got.note
    assert json.loads(fm.read_bytes(owner_path(fm, copy)))["name"] == "events_b"
    assert claim(fm, root, "events_b", "run 3").other.name == "events_a"  # the original still is a's


@pytest.mark.parametrize("damage", [b"{not json", b"[]", b'{"checkpoint": "x"}', b""])
def test_a_record_that_cannot_be_read_is_replaced_and_said(location, damage):
    fm, root, _ = location
    fm.write_bytes(owner_path(fm, root), damage)
    got = claim(fm, root, "events_b", "run 1")
    assert got.other is None and "could not be read" in got.note and fm.url(got.path) in got.note
    assert json.loads(fm.read_bytes(got.path))["name"] == "events_b"


def test_a_record_that_cannot_be_written_is_said_not_raised(tmp_path):
    """The store refuses the write (here: the ops directory is a file): the claim says so, and a later claim,
    once it can write, records the owner."""
    fm, root = open_file_manager(str(tmp_path / "q" / "checkpoint"))
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / ".checkpoint-ops").write_text("not a directory")
    got = claim(fm, root, "events_a", "run 1")
    assert got.other is None and "could not be written" in got.note, got
    (tmp_path / "q" / ".checkpoint-ops").unlink()
    assert claim(fm, root, "events_a", "run 2").note is None
    assert claim(fm, root, "events_b", "run 3").other.name == "events_a"


@pytest.mark.parametrize("linked", ["parent", "checkpoint"])
def test_one_directory_reached_through_a_link_has_one_record(tmp_path, linked):
    """A volume mounted at two paths (a symbolic link to the checkpoint's parent, or to the checkpoint itself):
    before, the second spelling took the record for a copy and rewrote it, and the two assets took turns."""
    (tmp_path / "real" / "checkpoint").mkdir(parents=True)
    if linked == "parent":
        (tmp_path / "link").symlink_to(tmp_path / "real")
        other = str(tmp_path / "link" / "checkpoint")
    else:
        (tmp_path / "real" / "alias").symlink_to(tmp_path / "real" / "checkpoint")
        other = str(tmp_path / "real" / "alias")
    fm, root = open_file_manager(str(tmp_path / "real" / "checkpoint"))
    assert claim(fm, root, "events_a", "run 1").other is None
    fm_other, root_other = open_file_manager(other)
    got = claim(fm_other, root_other, "events_b", "run 2")
    assert got.other is not None and got.other.name == "events_a" and got.note is None, got
    assert claim(fm, root, "events_a", "run 3").recorded


def test_a_record_the_store_cannot_read_is_an_error_not_a_takeover(tmp_path):
    """Only a record whose content is damaged is replaced; one that cannot be read at all (here a directory
    where the file should be) stops the claim, naming the file, and nothing is written."""
    fm, root = open_file_manager(str(tmp_path / "q" / "checkpoint"))
    os.makedirs(owner_path(fm, root))
    with pytest.raises(BadInputError) as e:
        claim(fm, root, "events_b", "run 1")
    assert e.value.path == fm.url(owner_path(fm, root)) and "nothing ran, nothing changed" in e.value.fix
    assert os.path.isdir(owner_path(fm, root))


def test_a_judged_claim_says_what_would_be_rewritten(tmp_path):
    fm, root = open_file_manager(str(tmp_path / "q" / "checkpoint"))
    fm.write_bytes(owner_path(fm, root), b"{torn")
    got = claim(fm, root, "events_b", "dry run", write=False)
    assert "to be rewritten when the query runs" in got.note and not got.recorded
    assert fm.read_bytes(owner_path(fm, root)) == b"{torn"
