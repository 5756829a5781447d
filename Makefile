# Everything a fresh machine needs: `make test`, `make demo`; `make ui` serves the example in Dagster.
# Creates .venv (Python 3.11) if missing and installs the project with its dev extras.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-operators demo ui bench reliability check-java check-rclone venv clean

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: Java 17 or newer is required by PySpark 4.3, and 'java' is not on PATH." >&2; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2; \
	  echo "  macOS:         brew install openjdk@17 (then follow brew's PATH hint)" >&2; \
	  echo "  or set JAVA_HOME and put \$$JAVA_HOME/bin on PATH." >&2; exit 1; }
	@v=$$(java -version 2>&1 | head -n1 | sed -E 's/.*version "(1\.)?([0-9]+).*/\2/'); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ] 2>/dev/null; then \
	  echo "error: Java 17 or newer is required by PySpark 4.3; found: $$(java -version 2>&1 | head -n1)" >&2; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless; macOS: brew install openjdk@17" >&2; \
	  exit 1; fi

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: no python3.11 (or python3) on PATH" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), \
	  f"Python 3.11 is required, {sys.executable} is {sys.version.split()[0]}"'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

venv: $(STAMP)

# The suite on TEST_WORKERS processes (each with its own Spark session), a test file to a process; TEST_WORKERS=0 runs
# it in this one process (the order and fixtures are the same).
TEST_WORKERS ?= 2

test: check-java $(STAMP)
	$(PY) -m pytest -n $(or $(TEST_WORKERS),2) --dist loadfile --no-loadscope-reorder

# Every stateful operator on every state store Spark allows for it (`make test` runs a representative part).
test-operators: check-java $(STAMP)
	$(PY) -m pytest tests/test_operators_spark.py -m "operators or operators_full"

demo: check-java $(STAMP)
	$(PY) -m pipelines.demo

# The example definitions (pipelines/definitions.py) in the Dagster UI on http://127.0.0.1:3000, with the
# instance settings of dagster_home/dagster.yaml (one writer per checkpoint pool) and the schedules and sensors running.
ui: check-java $(STAMP)
	DAGSTER_HOME=$(CURDIR)/dagster_home DAGSTER_DISABLE_TELEMETRY=1 $(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# The crash matrix at every crash point (`make test` kills at a sample of them), the bad-input corpus and the long fault matrix (25 % and 50 % failing requests, several
# seeds, a 30-second outage; `make test` runs a short one), recorded into docs/reliability.md.
reliability: check-java $(STAMP)
	rm -f .reliability.jsonl
	CHECKPOINT_OPS_MATRIX_OUT=$(CURDIR)/.reliability.jsonl CHECKPOINT_OPS_FAULT_MATRIX=long CHECKPOINT_OPS_CRASH_MATRIX=full \
	  $(PY) -m pytest tests/test_crash_matrix.py tests/test_races.py tests/test_bad_input_corpus.py tests/test_fault_matrix.py
	$(PY) tests/reliability_report.py .reliability.jsonl docs/reliability.md
	rm -f .reliability.jsonl

# All benchmarks, one after another in one run (about an hour on 2 cores; benchmarks/run_all.py lists them); each report is recorded
# in docs/benchmarks.md, in the section run_all.py marks (the rest of the file is left as it is).
check-rclone:
	@command -v rclone >/dev/null 2>&1 || { \
	  echo "error: the backup benchmark compares with rclone, which is not on PATH." >&2; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y rclone    macOS: brew install rclone" >&2; exit 1; }

bench: check-java check-rclone $(STAMP)
	$(PY) benchmarks/run_all.py --out docs/benchmarks.md

clean:
	rm -rf $(VENV) demo_data .pytest_cache .checkpoint-ops-home
