"""The built wheel, as a new user gets it: installed into a fresh venv beside a user project that has its own
``pipelines`` and ``resources`` packages (tests/user_project). The core install runs the CLI without Spark or
Dagster; with ``[dagster]`` the project (one query from Python, one from a defs.yaml component) validates,
materializes, rolls back from launchpad run config and reprocesses through the request sensor, with Spark
reading every output; ``dg`` lists and scaffolds the component. One venv for the module (about a minute to
build and install)."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER_PROJECT = Path(__file__).resolve().parent / "user_project"


def sh(cmd: list, cwd=None, env=None, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def site_listing(venv: Path) -> set[str]:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return set(os.listdir(site))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout; a fresh venv with the core install, checked, then ``[dagster]`` and
    dagster-dg-cli added. Returns what the checks saw."""
    root = tmp_path_factory.mktemp("package")
    # from a copy: building in the checkout rewrites its build/ and *.egg-info while the suite's other worker runs
    # processes from it (Dagster reads entry points from the egg-info beside a process started there)
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                                 "__pycache__", ".pytest_cache", "demo_data"))
    sh([sys.executable, "-m", "build", "--wheel", "--outdir", root / "dist", source])
    (wheel,) = (root / "dist").glob("*.whl")
    venv = root / "venv"
    sh([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    sh([py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    sh([py, "-m", "pip", "install", "--quiet", wheel])
    empty = root / "empty"
    empty.mkdir()
    core = {
        "help": sh([venv / "bin" / "checkpoint-ops", "--help"], cwd=empty).stdout,
        "missing": sh([py, "-c", "import importlib.util as u; print([m for m in ('pyspark', 'dagster', 'pandas') "
                       "if u.find_spec(m) is None])"], cwd=empty).stdout.strip(),
    }
    sh([py, "-m", "pip", "install", "--quiet", f"{wheel}[dagster]", "dagster-dg-cli>=1.13,<1.14"])
    before = site_listing(venv)
    sh([py, "-c", "import dagster_checkpoint_ops, checkpoint_ops.cli"], cwd=empty)
    return {"root": root, "wheel": wheel, "venv": venv, "core": core, "site_before": before,
            "import_wrote": sorted(site_listing(venv) - before) + os.listdir(empty)}


def user_env(installed, home: Path) -> dict:
    venv = installed["venv"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DAGSTER_HOME", "CHECKPOINT_OPS_HOME")}
    env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", "VIRTUAL_ENV": str(venv),
                "CHECKPOINT_OPS_HOME": str(home / "ops"), "USER_DATA_DIR": str(home / "data"),
                "DAGSTER_DISABLE_TELEMETRY": "1"})
    return env


def test_wheel_ships_only_the_library_and_the_integration(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        tops = {name.split("/")[0] for name in wheel.namelist()}
        entry_points = wheel.read(next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))).decode()
    assert {t for t in tops if not t.endswith(".dist-info")} == {"checkpoint_ops", "dagster_checkpoint_ops"}
    assert "[dagster_dg_cli.registry_modules]" in entry_points and "dagster_checkpoint_ops" in entry_points


def test_core_install_runs_the_cli_without_spark_or_dagster(installed):
    assert "checkpoint-ops" in installed["core"]["help"]
    assert installed["core"]["missing"] == "['pyspark', 'dagster', 'pandas']"


def test_importing_the_package_writes_nothing(installed):
    assert installed["import_wrote"] == []
    assert not {"pipelines", "resources", "demo_data"} & installed["site_before"]


def test_user_project_validates_materializes_rolls_back_and_senses(installed, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(USER_PROJECT, project)
    env = user_env(installed, tmp_path)
    py = installed["venv"] / "bin" / "python"
    validate = sh([installed["venv"] / "bin" / "dagster", "definitions", "validate", "-m", "pipelines.definitions",
                   "-d", project], cwd=project, env=env)
    assert "All code locations passed validation" in validate.stdout + validate.stderr
    drive = sh([py, "drive.py"], cwd=project, env=env)
    line = next(x for x in drive.stdout.splitlines() if x.startswith("DRIVE-RESULT "))
    seen = json.loads(line[len("DRIVE-RESULT "):])
    # the user's own packages, and ours from the installed wheel
    assert seen["pipelines_file"] == str(project / "pipelines" / "__init__.py")
    assert seen["resources_file"] == str(project / "resources" / "__init__.py")
    assert seen["package_file"].startswith(str(installed["venv"]))
    clicks, views = seen["runs"]["clicks_job"], seen["runs"]["views_job"]
    assert all(r["success"] for r in clicks + views), [r["failure"] for r in clicks + views]
    assert [r["metadata"].get("batch_ids") for r in clicks] == ["0..0", "1..1", "1..1", "1..1"]
    assert clicks[2]["metadata"]["rollback_target_batch"] == 0 and clicks[2]["metadata"]["rollback_op_id"]
    assert seen["sensor_run_requests"] == [{"job": "clicks_job", "config": {"ops": {"clicks": {"config": {
        "rollback_to_batch": 0}}}}}]
    assert clicks[3]["metadata"]["rollback_target_batch"] == 0
    # Spark reads every row exactly once after two rollbacks and reprocessings
    assert seen["clicks_rows"] == seen["clicks_expected"]
    assert seen["views_rows"] == seen["views_expected"]
    assert site_listing(installed["venv"]) == installed["site_before"]  # nothing written into site-packages


def test_dg_lists_and_scaffolds_the_component(installed, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(USER_PROJECT, project)
    env = user_env(installed, tmp_path)
    dg_cli = installed["venv"] / "bin" / "dg"
    listed = json.loads(sh([dg_cli, "list", "components", "--json"], cwd=project, env=env).stdout)
    assert "dagster_checkpoint_ops.StreamingQueryComponent" in {item["key"] for item in listed["items"]}
    sh([dg_cli, "scaffold", "defs", "dagster_checkpoint_ops.StreamingQueryComponent", "my_stream"], cwd=project,
       env=env)
    folder = project / "pipelines" / "defs" / "my_stream"
    assert "type: dagster_checkpoint_ops.StreamingQueryComponent" in (folder / "defs.yaml").read_text()
    assert "def build(spark)" in (folder / "query.py").read_text()
    validate = sh([installed["venv"] / "bin" / "dagster", "definitions", "validate", "-m", "pipelines.definitions",
                   "-d", project], cwd=project, env=env)
    assert "All code locations passed validation" in validate.stdout + validate.stderr
    probe = ("from pipelines.definitions import defs; print(sorted(s.key.to_user_string() for s in "
             "defs.resolve_all_asset_specs()))")
    assert sh([installed["venv"] / "bin" / "python", "-c", probe], cwd=project, env=env).stdout.strip() == \
        "['clicks', 'my_stream', 'views']"
