"""``make bench`` records its reports in one marked section of docs/benchmarks.md (benchmarks/run_all.py):
a second run replaces that section, the rest of the file stays, and a failed benchmark is recorded as one."""

from benchmarks.run_all import BEGIN, END, Outcome, record, section


def _outcome(name: str, exit_code: int = 0, report: str = "| a | b |") -> Outcome:
    return Outcome(name, f"python benchmarks/{name}.py", exit_code, report, "Traceback: boom" if exit_code else "",
                   12.0, 0.5, 1.5)


def test_a_second_run_replaces_the_section_and_keeps_the_rest(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nanalysis written by hand\n")
    record(str(doc), section([_outcome("rollback", report="first run")], "abc1234", "2026-11-24 11:00 UTC"))
    record(str(doc), section([_outcome("rollback", report="second run"), _outcome("memory", exit_code=2)],
                             "def5678", "2026-11-24 12:00 UTC"))
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nanalysis written by hand\n")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "second run" in text and "first run" not in text and "def5678" in text
    assert "**Failed** (exit 2)" in text and "Traceback: boom" in text
    assert "| `python benchmarks/memory.py` | 2 | 12 | 0.5 → 1.5 |" in text


def test_an_unfinished_run_says_how_far_it_got(tmp_path):
    doc = tmp_path / "benchmarks.md"
    record(str(doc), section([_outcome("rollback")], "abc1234", "2026-11-24 11:00 UTC", planned=7))
    assert "1 of 7 benchmarks so far" in doc.read_text()
    record(str(doc), section([_outcome(f"b{i}") for i in range(7)], "abc1234", "2026-11-24 11:00 UTC", planned=7))
    assert "so far" not in doc.read_text()
