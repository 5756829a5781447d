"""checkpoint_ops is the pure library: it must not import Dagster (or PySpark)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import checkpoint_ops


def test_checkpoint_ops_imports_no_dagster_or_pyspark():
    modules = [m.name for m in pkgutil.walk_packages(checkpoint_ops.__path__, "checkpoint_ops.")]
    assert "checkpoint_ops.cli" in modules and "checkpoint_ops.storage.direct_put" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'pyspark', 'dagster_pyspark'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
