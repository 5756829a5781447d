"""The digest a manifest ends with (``repository.seal_manifest``): an edit that still parses is found, a new
layout of the same content is not damage, and a manifest written before the digest is read as before."""

import json

from checkpoint_ops.backup.repository import digest_problem, seal_manifest

DOC = {"format": 1, "id": "b1", "roots": {"checkpoint": {"url": "/c", "files": [["offsets/0", "a" * 64, 3, 1.5],
                                                                                 ["commits/0", "b" * 64, 2, 1.5]]}}}


def test_a_sealed_manifest_matches_its_digest_in_its_own_bytes_and_in_another_layout():
    blob = seal_manifest(DOC)
    doc = json.loads(blob)
    assert list(doc)[-1] == "digest" and {k: v for k, v in doc.items() if k != "digest"} == DOC
    assert digest_problem(blob, doc) is None
    pretty = json.dumps(doc, indent=2).encode()
    assert digest_problem(pretty, json.loads(pretty)) is None


def test_an_entry_dropped_or_renamed_after_sealing_is_found():
    for change in (lambda d: d["roots"]["checkpoint"]["files"].pop(0),
                   lambda d: d["roots"]["checkpoint"]["files"][1].__setitem__(0, "commits/99")):
        doc = json.loads(seal_manifest(DOC))
        change(doc)
        for blob in (json.dumps(doc, separators=(",", ":")).encode(), json.dumps(doc, indent=1).encode()):
            assert "does not match the digest it records" in digest_problem(blob, json.loads(blob))


def test_a_manifest_without_a_digest_is_read_as_before():
    blob = json.dumps(DOC, separators=(",", ":")).encode()
    assert digest_problem(blob, DOC) is None
