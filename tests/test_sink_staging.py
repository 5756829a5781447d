"""A sink operation stages the log files it rewrites beside the output (``.checkpoint-ops/<out>/staging/``)
before it is applied; once applied, or finished by ``resume`` after a crash, none of them is left. Several
rewrites with the same content (log files emptied by ``sink retain``) share one staged copy. Fast tier: a
synthetic checkpoint and file sink in Spark's formats, crashes through the kill switch in a forked child."""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks import synthetic
from tests.crash import ForkRunner
from tests.helpers import cli_json
from tests.synthetic_sink import write_sink

SINK = ("--sink-compact-interval", "5")


def _setup(base) -> tuple[str, str, str]:
    ckpt, out = str(base / "ckpt"), str(base / "out")
    synthetic.write_local(ckpt, batches=24, partitions=1, retain_state=24)
    write_sink(out, 24, compact_interval=5)
    code, r = cli_json("ledger", "sync", ckpt, "--sink", out, *SINK)
    assert code == 0, r
    return ckpt, out, str(base / ".checkpoint-ops" / "out" / "staging")


def _staged(staging: str) -> list[str]:
    return sorted(n for _, _, names in os.walk(staging) for n in names)


def _retain(ckpt: str, out: str) -> list[str]:
    return ["sink", "retain", out, "--checkpoint", ckpt, "--keep-after-batch", "15", *SINK, "--yes", "--json"]


def test_an_applied_retain_leaves_no_staged_rewrites(tmp_path):
    ckpt, out, staging = _setup(tmp_path)
    code, r = cli_json(*_retain(ckpt, out)[:-1])
    assert code == 0, r
    assert r["plan"]["counts"]["replace"] >= 3  # several emptied log files, one content
    assert _staged(staging) == []  # before: 4 staged copies (and their checksum files) left behind


@pytest.fixture(scope="module")
def runner():
    r = ForkRunner()
    yield r
    r.close()


def test_a_resumed_retain_leaves_no_staged_rewrites(runner, tmp_path):
    pristine = tmp_path / "pristine"
    _setup(pristine)
    resumed = 0
    for k in range(1, 400, 9):  # sampled: every crash point costs a copy, a killed run and a resume
        base = tmp_path / f"k{k}"
        shutil.copytree(pristine, base, symlinks=True)
        ckpt, out, staging = str(base / "ckpt"), str(base / "out"), str(base / ".checkpoint-ops" / "out" / "staging")
        code, _, err = runner.run(*_retain(ckpt, out), kill_at=k)
        if code == 0:
            assert _staged(staging) == []
            break
        assert code < 0, err  # killed
        code, _, err = runner.run("resume", ckpt, "--json")
        if code == 0:
            resumed += 1
            assert _staged(staging) == [], f"killed at {k}, resumed: {_staged(staging)}"
        shutil.rmtree(base)
    else:
        pytest.fail("the retain never finished")
    assert resumed > 0, k
