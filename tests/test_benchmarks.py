"""The benchmarks' code paths, at toy sizes (their numbers come from real runs, see docs/benchmarks.md and docs/results.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare_methods  # noqa: E402
import gpu_sd35  # noqa: E402
import step_noise  # noqa: E402


@pytest.mark.slow  # the GPU benchmark on a tiny model, on CPU
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


@pytest.mark.slow  # a benchmark run with its plots
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


@pytest.mark.slow  # trains every rate of a grid, then the comparison
def test_compare_methods_sweep_chooses_each_methods_best_rate_and_the_comparison_reads_it(tmp_path: Path) -> None:
    common = ["--out", str(tmp_path), "--nfe-budget", "200", "--batch-size", "1", "--eval-every", "1",
              "--eval-seeds", "1", "--threads", "1"]  # fmt: skip
    # an earlier sweep call (another process) left dancegrpo's entry: this call keeps it
    earlier = {"grid": [{"lr": 1e-4, "final_reward": [0.5], "mean": 0.5}], "chosen_lr": 1e-4, "seeds": [101]}
    settings = vars(compare_methods.parse(["--sweep", "--seed-list", "100", *common]))
    (tmp_path / "sweep.json").write_text(json.dumps({"settings": {k: str(v) if isinstance(v, Path) else v
                                                                  for k, v in settings.items()},
                                                     "methods": {"dancegrpo": earlier}}))  # fmt: skip
    report = compare_methods.main(["--sweep", "--methods", "treegrpo", "--seed-list", "100", *common])
    entry = report["methods"]["treegrpo"]
    assert [g["lr"] for g in entry["grid"]] == list(compare_methods.methods(10)["treegrpo"].lr_grid)
    best = max(entry["grid"], key=lambda g: g["mean"])
    assert entry["chosen_lr"] == best["lr"] and entry["seeds"] == [100]
    assert all(g["mean"] == g["final_reward"][0] for g in entry["grid"])
    merged = json.loads((tmp_path / "sweep.json").read_text())["methods"]
    assert list(merged) == ["dancegrpo", "treegrpo"] and merged["dancegrpo"]["chosen_lr"] == 1e-4
    assert "| treegrpo | 100 |" in (tmp_path / "sweep.md").read_text()
    # the comparison takes the chosen rates, and reuses no sweep run (other seeds)
    results = compare_methods.main(["--methods", "treegrpo", "--seed-list", "3", "--lrs", str(tmp_path / "sweep.json"), *common])
    assert results["methods"]["treegrpo"]["lr"] == entry["chosen_lr"]
    assert results["methods"]["dancegrpo"]["lr"] == 1e-4
    assert (tmp_path / "runs" / f"treegrpo_lr{best['lr']:g}_seed3.json").is_file()
    # the seeds that chose the rates are not reported
    with pytest.raises(SystemExit):
        compare_methods.parse(["--out", str(tmp_path), "--seed-list", "0", "101"])


def test_compare_methods_speedups_to_the_baselines_targets() -> None:
    # two seeds of a method that reached the target at 10 s and 30 s, a baseline at 40 s on average
    base = {"seconds_to_target": {"mean": 40.0}, "per_seed": []}
    mine = {"per_seed": [{"seconds_to_target": 10.0}, {"seconds_to_target": 30.0}]}
    # ratio of the means 40 / 20 = 2; per seed 40 / 10 = 4 and 40 / 30 = 1.33
    got = compare_methods.speedup_to(base, mine, "seconds_to_target")
    assert got == pytest.approx({"mean": 2.0, "min": 40 / 30, "max": 4.0, "reached": 2})
    assert compare_methods.speedup_to(base, {"per_seed": [{"seconds_to_target": None}]}, "seconds_to_target") is None
    assert compare_methods.speedup_to({"seconds_to_target": {"mean": None}}, mine, "seconds_to_target") is None


def test_step_noise_scores_one_stochastic_step_at_a_time_for_any_adapter(tmp_path: Path) -> None:
    report = step_noise.main([
        "--out", str(tmp_path), "--adapter", "lit_treegrpo.models.tiny.TinySD3Adapter", "--adapter-kwargs",
        '{"guidance_scale": 1.0}', "--reward", "brightness", "--prompts", "animals", "--val-fraction", "0",
        "--num-prompts", "2", "--chains", "2", "--steps", "3",
    ])  # fmt: skip
    rows = report["rows"]
    # per sampler: the ODE row, one row per step 0 .. T-2, and all of them together
    assert [r["step"] for r in rows] == [None, 0, 1, "all"] * 2
    ode = [r for r in rows if r["step"] is None]
    # the deterministic samples start from the same noises whatever the SDE: equal across samplers
    assert ode[0]["per_prompt"] == ode[1]["per_prompt"]
    assert rows[1]["per_prompt"] != ode[0]["per_prompt"]  # a stochastic step changes the samples
    assert len(report["sigmas"]) == 4 and report["sigmas"][-1] == 0.0
    saved = json.loads((tmp_path / "step_noise.json").read_text())
    assert (tmp_path / "step_noise.md").read_text().strip() == step_noise.table(saved)
