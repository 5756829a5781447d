"""A command line argparse rejects, with ``--json``: the error document on stdout, as for every other error (exit 2,
usage on stderr as before). A hostile review's ``rollback CKPT --to-batchh 3 --json`` printed usage on stderr only,
and a program reading stdout got nothing. Fast tier: nothing is read or written."""

from __future__ import annotations

import json

import pytest

from tests.helpers import cli


@pytest.mark.parametrize("args, problem, command", [
    (("rollback", "/nowhere", "--to-batchh", "3"), "unrecognized arguments: --to-batchh 3", "checkpoint-ops"),
    (("rollback", "/nowhere", "--to-batch", "abc"), "argument --to-batch: invalid int value: 'abc'",
     "checkpoint-ops rollback"),
    (("backup", "create", "/nowhere"), "the following arguments are required: DEST_URL",
     "checkpoint-ops backup create"),
], ids=["unknown-flag", "not-a-number", "missing-argument"])
def test_a_usage_error_with_json_is_a_json_error_document(args, problem, command):
    code, out, err = cli(*args, "--json")
    assert code == 2 and "usage:" in err, (code, err)
    doc = json.loads(out)
    assert doc == {"error": "BadInputError", "path": None, "problem": problem,
                   "fix": f"`{command} --help` lists what it takes"}, doc


def test_a_usage_error_without_json_prints_nothing_on_stdout():
    code, out, err = cli("rollback", "/nowhere", "--to-batchh", "3")
    assert code == 2 and out == "" and "unrecognized arguments" in err, (out, err)


def test_a_prefix_of_json_that_argparse_takes_for_it_counts():
    """argparse takes ``--jso`` for ``--json``: the error document is printed for it too (a review)."""
    code, out, err = cli("rollback", "/nowhere", "--to-batchh", "3", "--jso")
    assert code == 2 and json.loads(out)["problem"] == "unrecognized arguments: --to-batchh 3", (out, err)
