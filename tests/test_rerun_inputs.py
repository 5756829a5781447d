"""``rerun_inputs``: which input files a file-source log names are gone (each looked up, or one listing of a
directory holding many), shown as the paths to move them back to (decoded); files on another store are counted
as not checked. Local and on the S3 server. The entries of a compaction batch come from its compaction file."""

from __future__ import annotations

import json

import boto3

from checkpoint_ops.rerun_inputs import find_missing, missing_warning
from checkpoint_ops.storage import open_file_manager


def test_local_files_gone_are_found_each_looked_up(tmp_path):
    for rel in ("in/a.json", "in/p=1/b.json", "in/with space.json", "in/day=2026 01 02/100%.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    fm, _ = open_file_manager(str(tmp_path))
    urls = [f"file://{tmp_path}/in/a.json", f"file://{tmp_path}/in/gone.json", f"file://{tmp_path}/in/p=1/b.json",
            f"file://{tmp_path}/in/p=2/c.json", f"file://{tmp_path}/in/with%20space.json", "s3a://elsewhere/x.json",
            f"file://{tmp_path}/in/day=2026%2001%2002/100%25.json", f"file://{tmp_path}/in/day=2026%2001%2002/5%25.json"]
    before = fm.counter.snapshot()
    found = find_missing(fm, urls)
    spent = {k: v - before.get(k, 0) for k, v in fm.counter.snapshot().items() if v != before.get(k, 0)}
    assert spent == {"stat": 7}, spent  # one per file on this store: no directory listed
    # decoded: the paths to move them back to, as Spark's archive keeps them
    assert found.missing == [f"{tmp_path}/in/gone.json", f"{tmp_path}/in/day=2026 01 02/5%.json",
                             f"{tmp_path}/in/p=2/c.json"]
    assert found.looked == 7 and found.unchecked == 1
    warning = missing_warning("sources/0", [7, 8], 10, found, "input files gone (sources/0)")
    assert warning.startswith("sources/0: 3 of the 7 input files of its log offsets 7..8 are no longer where"), warning
    assert "all in the plan's summary, 'input files gone (sources/0)'" in warning, warning
    assert "the files of its 8 later log offsets the rollback removes were not looked for" in warning, warning
    assert "later log offsets" not in missing_warning("sources/0", [7], 1, found, "k")
    assert missing_warning("sources/0", [7], 1, find_missing(fm, urls[:1]), "k") is None


def test_objects_gone_are_found_on_the_s3_server(s3_server, bucket):
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.put_object(Bucket=bucket, Key="in/a.json", Body=b"{}\n")
    fm, _ = open_file_manager(f"s3://{bucket}/ckpt", {"endpoint_url": s3_server})
    before = fm.counter.snapshot()
    found = find_missing(fm, [f"s3a://{bucket}/in/a.json", f"s3a://{bucket}/in/b.json", "file:///tmp/x.json"])
    assert fm.counter.snapshot() == {**before, "HeadObject": before.get("HeadObject", 0) + 2}
    assert found.missing == [f"s3a://{bucket}/in/b.json"] and found.looked == 2 and found.unchecked == 1


def test_the_files_of_a_compaction_batch_come_from_its_compaction_file(tmp_path):
    """Batches 3..6 of a log compacted every 3 (2.compact and 5.compact, 3 and 4 deleted by Spark, 6 plain):
    each batch's own files, whichever file holds them."""
    from checkpoint_ops.model.compactible import CompactibleLog
    from checkpoint_ops.model.listing import Listing
    from checkpoint_ops.rerun_inputs import input_urls

    def entry(b):
        return json.dumps({"path": f"file:///in/{b}.json", "timestamp": 1, "batchId": b}, separators=(",", ":"))

    log_dir = tmp_path / "sources" / "0"
    log_dir.mkdir(parents=True)
    (log_dir / "2.compact").write_text("\n".join(["v1", *(entry(b) for b in range(3))]))
    (log_dir / "5.compact").write_text("\n".join(["v1", *(entry(b) for b in range(6))]))
    (log_dir / "6").write_text("\n".join(["v1", entry(6)]))
    fm, root = open_file_manager(str(tmp_path))
    log = CompactibleLog(Listing.scan(fm, root), "sources/0", "source log", 3)
    assert input_urls(log, [3, 4, 5, 6]) == ["file:///in/6.json", "file:///in/3.json", "file:///in/4.json",
                                             "file:///in/5.json"]
    assert input_urls(log, [2]) == ["file:///in/2.json"]


def test_many_files_of_one_directory_are_judged_by_one_listing(tmp_path):
    """More than MAX_PROBED files of one directory: one listing instead of a lookup each."""
    from checkpoint_ops.rerun_inputs import MAX_PROBED

    (tmp_path / "in").mkdir()
    for i in range(MAX_PROBED + 1):
        (tmp_path / "in" / f"{i}.json").write_text("{}\n")
    fm, _ = open_file_manager(str(tmp_path))
    urls = [f"file://{tmp_path}/in/{i}.json" for i in range(MAX_PROBED + 2)]  # the last one is not there
    before = fm.counter.snapshot()
    found = find_missing(fm, urls)
    spent = {k: v - before.get(k, 0) for k, v in fm.counter.snapshot().items() if v != before.get(k, 0)}
    assert spent == {"list": 1}, spent
    assert found.missing == [f"{tmp_path}/in/{MAX_PROBED + 1}.json"] and found.looked == MAX_PROBED + 2
