"""The benchmarks' code paths, at toy sizes (their numbers come from real runs, see the README)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare_methods  # noqa: E402
import gpu_sd35  # noqa: E402


def test_gpu_sd35_runs_its_code_path_on_a_tiny_transformer(capsys) -> None:
    results = gpu_sd35.main(["--tiny", "--device", "cpu", "--repeats", "1", "--methods", "treegrpo", "dancegrpo_g27"])
    assert results["treegrpo"]["leaves"] == results["dancegrpo_g27"]["leaves"] == 27
    assert results["treegrpo"]["nfe"] == 202 and results["dancegrpo_g27"]["nfe"] == 270
    assert results["treegrpo"]["train_forwards"] == 13  # one forward per branching node
    assert results["dancegrpo_g27"]["train_forwards"] == 27 * 6  # 60% of 9 SDE steps, 27 chains
    assert "speed-up vs dancegrpo_g27" in capsys.readouterr().out


def test_gpu_sd35_without_a_gpu_says_how_to_run_it(capsys) -> None:
    if gpu_sd35.torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit):
        gpu_sd35.main([])
    assert "no GPU is visible" in capsys.readouterr().err


def test_compare_methods_writes_results_plots_and_a_table_of_the_same_numbers(tmp_path: Path, capsys) -> None:
    report = compare_methods.main([
        "--quick", "--out", str(tmp_path), "--methods", "treegrpo", "--nfe-budget", "400", "--batch-size", "1",
        "--eval-every", "1", "--eval-seeds", "1", "--threads", "1",
    ])  # fmt: skip
    saved = json.loads((tmp_path / "results.json").read_text())
    assert list(saved["methods"]) == ["dancegrpo", "treegrpo"]  # the reference always runs
    for name in ("reward_vs_nfe.png", "reward_vs_wallclock.png", "iteration_time.png"):
        assert (tmp_path / name).stat().st_size > 1000
    tree, dance = saved["methods"]["treegrpo"], saved["methods"]["dancegrpo"]
    # evaluated after every iteration: the curve's NFE steps are each iteration's rollout, k=3 on the
    # window of 3 steps that TreeGRPO's geometric law placed (202 NFE at offset 0, 176 at 1, ...)
    spec = compare_methods.methods(window_every=10)["treegrpo"].tree
    nfe = [p["nfe"] for p in tree["curves"][0]]
    assert [b - a for a, b in zip(nfe, nfe[1:])] == [spec.at(i).nfe() for i in range(len(nfe) - 1)]
    assert dance["nfe_per_iteration"]["sampling"]["mean"] == 270  # 27 chains of 10 steps
    assert tree["curves"][0][0]["nfe"] == 0 and tree["curves"][0][-1]["nfe"] >= 400
    ratio = dance["seconds_per_iteration"]["total"]["mean"] / tree["seconds_per_iteration"]["total"]["mean"]
    assert tree["speedup_vs_dancegrpo"]["time_per_iteration"] == pytest.approx(ratio)
    assert 0 <= tree["bookkeeping_fraction"]["mean"] < 1
    # the printed table is the JSON's numbers, formatted
    printed = capsys.readouterr().out
    assert compare_methods.table(saved["methods"], saved["target_reward"]) in printed
    assert compare_methods.table(report["methods"], report["target_reward"]) == compare_methods.table(
        saved["methods"], saved["target_reward"]
    )
