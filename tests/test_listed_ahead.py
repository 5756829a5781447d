"""The Dagster compat step lists the checkpoint on a thread while the user's ``build(spark)`` runs
(``dagster_checkpoint_ops.compat.ListedAhead``): the model it gives is the one the step would have made, what compat
derives from the listing first is made there, and a store that fails the listing fails the step with its own error,
raised in the step's thread, before any error of the build, as before (no Spark: synthetic checkpoints)."""

from __future__ import annotations

import pytest
import s3fs

from benchmarks import synthetic
from checkpoint_ops.errors import StoreUnavailableError
from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.storage import open_file_manager
from dagster_checkpoint_ops.compat import ListedAhead


def test_the_model_made_ahead_is_the_one_made_in_the_step(tmp_path):
    root = str(tmp_path / "ck")
    synthetic.write_local(root, batches=30, partitions=2, retain_state=5)
    fm, at = open_file_manager(root)
    ahead = ListedAhead(fm, at)
    got = ahead.result()
    assert not ahead._thread.is_alive()
    made = Checkpoint(fm, at)
    assert {rel: (f.size, f.mtime) for rel, f in got.listing.files.items()} == \
        {rel: (f.size, f.mtime) for rel, f in made.listing.files.items()}
    # what compat derives from the listing first was made on the thread (cached on the model); no file was read there
    assert {"kind", "offset_files", "commit_files"} <= set(vars(got)) and "metadata_raw" not in vars(got)
    assert (got.kind, got.latest_offset, got.latest_commit, got.fence) == \
        (made.kind, made.latest_offset, made.latest_commit, made.fence) == ("structured", 29, 29, None)


def test_a_store_that_fails_the_listing_fails_it_in_the_callers_thread(faulty_s3, s3_server, bucket, tmp_path):
    local = str(tmp_path / "ck")
    synthetic.write_local(local, batches=5, partitions=1, retain_state=2)
    s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True).put(local + "/", f"{bucket}/ck", recursive=True)
    fm, at = open_file_manager(f"s3://{bucket}/ck", {"endpoint_url": faulty_s3.endpoint})
    faulty_s3.outage(120)
    try:
        ahead = ListedAhead(fm, at)
        ahead._thread.join()
    finally:
        faulty_s3.calm()
    # the store answers again: the error the listing met is raised all the same, in this thread, and the store is
    # not listed a second time (which would double the time an outage takes to fail the step)
    with pytest.raises(StoreUnavailableError):
        ahead.result()
    assert ListedAhead(fm, at).result().latest_commit == 4  # a new step lists it


def test_a_listing_that_fails_is_reported_before_the_builds_own_error(faulty_s3, s3_server, bucket, tmp_path):
    """As before the listing ran beside the build: the checkpoint's store failing is what the step says, not an
    error of the user's code (or of what it returned) that ran meanwhile."""
    from types import SimpleNamespace

    from dagster_checkpoint_ops.compat import check_before_run
    from dagster_checkpoint_ops.query import StreamingQuery
    from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource

    local = str(tmp_path / "ck")
    synthetic.write_local(local, batches=5, partitions=1, retain_state=2)
    url = f"s3://{bucket}/ck"
    s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True).put(local + "/", f"{bucket}/ck", recursive=True)
    files = CheckpointFileManagerResource(endpoint_url=faulty_s3.endpoint)

    class Odd:  # what a build may return: asking it for an attribute raises (hasattr lets only AttributeError by)
        def __getattr__(self, name):
            raise RuntimeError("not a writer")

    for build in (lambda spark: Odd(), lambda spark: 1 / 0):
        query = StreamingQuery(name="q", checkpoint=url, build=build)
        faulty_s3.outage(120)
        try:
            with pytest.raises(StoreUnavailableError):
                check_before_run(None, query, SimpleNamespace(skip_compat_check=False), None, files)
        finally:
            faulty_s3.calm()
