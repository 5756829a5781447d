"""Unit tier: the order in which a plan's actions are applied, and the CLI's collector thresholds."""

import gc
import random

from checkpoint_ops.cli import main
from checkpoint_ops.collector import BULK_GC_THRESHOLDS, fewer_collections
from checkpoint_ops.plan import PHASES, FileAction, Plan

NAMES = ["12.delta", ".12.delta.crc", "12_1f0e.zip", "metadata", "x", "..5.y", "7", "7.", "0012.snapshot", "abc.1",
         "12abc.delta", "3_", ".3", "_9", "9_8.7", "10.changelog", "2.compact", "part-00000-1.parquet"]


def reference_key(action: FileAction) -> tuple:
    """The order's definition, written out: directory, then batch id (descending), then name."""
    parent, _, name = action.rel.rpartition("/")
    head = name.lstrip(".").split(".", 1)[0].split("_", 1)[0]
    return (parent, -int(head) if head.isdigit() else 0, action.rel)


def test_ordered_is_phase_then_directory_then_newest_batch_first():
    """``Plan.ordered`` (grouped by phase and directory, then sorted by batch) is exactly the sort by
    (phase rank, directory, -batch id, name) it replaces, on names of every shape a plan holds."""
    rng = random.Random(7)
    actions = []
    for _ in range(5000):
        folder = rng.choice(["", "offsets", "state/0/1", "state/0/10", "sources/0", "_spark_metadata"])
        name = rng.choice(NAMES) if rng.random() < 0.4 else \
            f"{rng.randint(0, 300)}{rng.choice(['.delta', '.snapshot', '', '_u.zip', '.crc', '.compact'])}"
        actions.append(FileAction("delete", rng.choice(["checkpoint", "sink0"]), f"{folder}/{name}".lstrip("/"),
                                  "why", rng.choice(PHASES)))
    rank = {phase: i for i, phase in enumerate(PHASES)}
    expected = sorted(actions, key=lambda a: (rank[a.phase], *reference_key(a)))
    assert Plan("rollback", {}, 1, actions=list(actions)).ordered() == expected
    logs = [a for a in Plan("rollback", {}, 1, actions=list(actions)).ordered() if a.rel.startswith("offsets/")
            and a.rel[8:].isdigit() and a.phase == "offsets"]
    assert [int(a.rel[8:]) for a in logs] == sorted((int(a.rel[8:]) for a in logs), reverse=True)


def test_a_command_runs_with_raised_collector_thresholds_and_restores_them():
    """Inside a command the collector's thresholds are ``BULK_GC_THRESHOLDS``; after it, also after a
    failure, they are what they were (``main`` is called in-process by benchmarks and tests)."""
    before = gc.get_threshold()
    assert before != BULK_GC_THRESHOLDS
    with fewer_collections():
        assert gc.get_threshold() == BULK_GC_THRESHOLDS
    assert gc.get_threshold() == before
    try:
        with fewer_collections():
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.get_threshold() == before
    assert main(["lease", "show", "/nonexistent/checkpoint-ops-test"]) == 2  # a command that fails: exit 2
    assert gc.get_threshold() == before
