"""Rule 5 (docs/failure_modes.md): the benchmark's reader trusts no file of its cache. A record it
cannot read is named with what to do (delete it to train the run again); ``--report`` and
``--status`` on a folder without the design's runs say so, and create nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORTED = REPO / "benchmarks" / "results" / "shapes_cpu_750k" / "runs"


def _error(capsys, *argv: str) -> str:
    import compare_methods

    with pytest.raises(SystemExit) as exit_info:
        compare_methods.main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "not a run record (invalid JSON: "),  # cut to 100 bytes, as by a full disk
        ("{}", "not a complete run record (no 'identity', 'spec', 'config', 'iterations', 'curve')"),
        ("[1, 2]", "not a run record (a JSON list, not an object)"),
        ("", "not a run record (invalid JSON: Expecting value at line 1, column 1)"),
        ('{"identity": {}, "spec": {"method": "x"}, "config": {}, "iterations": [], "curve": []}', "not a run record (its 'spec' is {'method': 'x'}, not a run's)"),
        ('{"identity": [], "spec": {"method": "x", "lr": 1, "seed": 0}, "config": {}, "iterations": [], "curve": []}',
         "not a run record (its 'identity' is a list)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("mode", ["--report", "--status"])
def test_a_record_that_cannot_be_read_is_named_with_what_to_do(
    copy: Path, capsys, content: str | None, problem: str, mode: str
) -> None:
    bad = sorted((copy / "runs").glob("*.json"))[1]
    bad.write_text(bad.read_text()[:100] if content is None else content)
    line = _error(capsys, mode, "--out", str(copy))
    assert line.startswith(f"error: {bad}: {problem}"), line
    assert line.endswith("; delete it to train that run again"), line
    assert not (copy / "results.json").exists()


def test_a_record_over_the_size_bound_is_named(copy: Path, capsys, monkeypatch) -> None:
    from compare import runs

    monkeypatch.setattr(runs, "MAX_RECORD_BYTES", 1000)
    line = _error(capsys, "--status", "--out", str(copy))
    assert "is larger than 1000 bytes" in line and "; delete it to train that run again" in line, line


def test_report_on_a_missing_or_empty_folder_says_there_are_no_runs_and_creates_nothing(tmp_path: Path, capsys) -> None:
    for mode in ("--report", "--status"):
        line = _error(capsys, mode, "--out", str(tmp_path / "none"))
        assert line == f"error: no runs in {tmp_path / 'none'}; check --out, or train them with --work", line
        assert not (tmp_path / "none").exists()
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    assert _error(capsys, "--report", "--out", str(tmp_path / "empty")).startswith("error: no runs in")


def test_report_with_another_design_names_the_one_the_folder_holds(copy: Path, capsys) -> None:
    line = _error(capsys, "--report", "--design", "540k", "--out", str(copy))
    assert line == f"error: {copy} holds design 750k+, not 540k; give --design 750k+", line
    record = sorted((copy / "runs").glob("*.json"))[0]
    saved = json.loads(record.read_text())
    for other in sorted((copy / "runs").glob("*.json")):
        other.unlink()
    saved["identity"]["protocol"]["budget"] = 1.0
    record.write_text(json.dumps(saved))
    line = _error(capsys, "--status", "--out", str(copy))
    assert line == f"error: {copy} holds runs of no known design, none of 750k+; check --out and --design", line


def test_status_of_the_ceilings_before_their_runs_plans_them_from_the_reported_folder(tmp_path: Path, capsys) -> None:
    import compare_methods

    out = tmp_path / "ceilings"
    compare_methods.main(["--status", "--ceiling", "--reported", str(REPORTED.parent), "--out", str(out)])
    text = capsys.readouterr().out
    assert f"the ceilings (1,200,000 units), runs in {out / 'runs'}" in text
    for method, lr in (("dancegrpo", "0.0003"), ("flowgrpo", "0.001"), ("branchgrpo", "1e-05")):
        assert f"  {method:<20} 0/5 runs at {lr} (0 to go extend a shorter run)" in text  # no checkpoints in git
    assert "ceiling runs done" in text and not out.exists()
    for mode in ("--status", "--work"):  # a wrong --reported would plan no ceiling at all: refused
        line = _error(capsys, mode, "--ceiling", "--reported", str(tmp_path / "none"), "--out", str(out))
        assert line == (
            f"error: no runs in {tmp_path / 'none'}; check --reported, or train them with "
            f"--work --design 750k+ --out {tmp_path / 'none'}"
        ), line
        assert not out.exists()


def test_every_committed_ceiling_run_begins_as_its_750k_run_exactly() -> None:
    """docs/benchmarks.md: a ceiling run trained from the start equals its 750k run up to 750k units
    (same data order, noises and updates), so a longer budget changes nothing it shares. Checked
    on every ceiling record committed, each evaluation seed's reward included."""
    ceilings = sorted((REPO / "benchmarks" / "results" / "shapes_cpu_1200k" / "runs").glob("*.json"))
    assert ceilings, "no ceiling run committed"
    for path in ceilings:
        shorter = REPORTED / path.name  # the same method, rate and seed at 750k
        assert shorter.exists(), f"{path.name}: no 750k run of the same method, rate and seed"
        longer = {p["units"]: p for p in json.loads(path.read_text())["curve"]}
        points = json.loads(shorter.read_text())["curve"]
        assert all(longer[p["units"]]["reward_per_seed"] == p["reward_per_seed"] for p in points), path.name
