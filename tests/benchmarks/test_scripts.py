"""The benchmarks' code paths, at toy sizes (their numbers come from real runs, see docs/benchmarks.md and docs/results.md)."""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_sd35  # noqa: E402
import real_width  # noqa: E402
import rollout_cost  # noqa: E402
import step_noise  # noqa: E402
import training_memory  # noqa: E402

#: what a training loop of its own would call: the engine's rollout and loss pieces, or a backward pass
LOOP_PARTS = {"rollout", "recompute_log_probs", "edge_loss", "tree_advantages", "source_minibatches", "backward"}


def calls_in(node: ast.AST) -> set[str]:
    """The names called under ``node``: ``f(...)`` gives ``f``, ``x.f(...)`` gives ``f``."""
    calls = (n.func for n in ast.walk(node) if isinstance(n, ast.Call))
    return {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "") for f in calls}


def parsed(script: str) -> ast.Module:
    return ast.parse((BENCH / script).read_text())


@pytest.mark.parametrize("script", ["gpu_sd35.py", "real_width.py", "rollout_cost.py"])
def test_the_benchmarks_run_the_training_step_of_fit_not_a_loop_of_their_own(script: str) -> None:
    called = calls_in(parsed(script))
    assert "run_step" in called and "build_algorithm" in called, script  # benchmarks/_drive.py
    assert not called & LOOP_PARTS, (script, called & LOOP_PARTS)


def test_the_drive_steps_the_treegrpo_the_module_builds() -> None:
    module = parsed("_drive.py")
    functions = {f.name: f for f in ast.walk(module) if isinstance(f, ast.FunctionDef)}
    run_step = functions["run_step"]
    assert ast.unparse(run_step.args.args[0].annotation) == "TreeGRPO"
    assert "step" in calls_in(run_step) and "end_step" in calls_in(run_step)
    assert "TreeGRPOModule" in calls_in(functions["build_algorithm"])
    # its one backward pass is the Optimization's, which TreeGRPO's update calls
    assert [name for name, f in functions.items() if "backward" in calls_in(f)] == ["backward"]
    assert not calls_in(module) & (LOOP_PARTS - {"backward"})


def test_gpu_sd35_runs_lora_and_full_fine_tuning_and_measures_their_memory(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    results = gpu_sd35.main(["--tiny", "--device", "cpu", "--repeats", "1", "--methods", "treegrpo",
                             "--json", str(out)])  # fmt: skip
    for training in ("lora", "full"):
        row = results[training]["treegrpo"]
        assert row["nfe"] == 202 and row["train_forwards"] == 13 and row["optimizer_steps"] == 4, training
        assert math.isfinite(row["peak_gib"]) and row["peak_gib"] > 0, training
    written = json.loads(out.read_text())
    assert written["peak_memory"].startswith("peak RSS") and written["results"] == json.loads(json.dumps(results))


@pytest.mark.slow  # the GPU benchmark's comparison on a tiny model, on CPU
def test_gpu_sd35_runs_its_code_path_on_a_tiny_transformer(capsys) -> None:
    results = gpu_sd35.main(["--tiny", "--device", "cpu", "--repeats", "1", "--methods", "treegrpo", "dancegrpo_g27",
                             "--training", "lora"])  # fmt: skip
    rows = results["lora"]
    assert rows["treegrpo"]["leaves"] == rows["dancegrpo_g27"]["leaves"] == 27
    assert rows["treegrpo"]["nfe"] == 202 and rows["dancegrpo_g27"]["nfe"] == 270
    assert rows["treegrpo"]["train_forwards"] == 13  # one forward per branching node
    assert rows["dancegrpo_g27"]["train_forwards"] == 27 * 6  # 60% of 9 SDE steps, 27 chains
    assert rows["dancegrpo_g27"]["optimizer_steps"] == 3  # DanceGRPO's preset
    assert "speed-up vs dancegrpo_g27" in capsys.readouterr().out


@pytest.mark.slow  # the GPU benchmark's switches on a tiny model, on CPU
def test_gpu_sd35_switches_run_and_are_written(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    results = gpu_sd35.main(["--tiny", "--device", "cpu", "--repeats", "1", "--methods", "treegrpo", "--training",
                             "lora", "--precision", "bf16-mixed", "--prompt-cache", "--json", str(out)])  # fmt: skip
    written = json.loads(out.read_text())
    assert written["switches"]["precision"] == "bf16-mixed" and written["switches"]["prompt_cache"] is True
    assert written["results"]["lora"]["treegrpo"]["nfe"] == results["lora"]["treegrpo"]["nfe"] == 202
    assert results["lora"]["treegrpo"]["reward_s"] >= 0 and results["lora"]["treegrpo"]["total_s"] > 0


def test_rollout_cost_times_tree_and_flat_through_the_training_step_with_their_memory() -> None:
    tree, flat = (rollout_cost.measure("xs", 10, kind, 1, 1, 1, 64) for kind in ("tree", "flat"))
    assert (tree["nfe"], tree["train_forwards"]) == (202, 13)  # one training forward per branching node
    assert (flat["nfe"], flat["train_forwards"]) == (270, 27 * 9)  # every SDE step of 27 chains
    for row in (tree, flat):
        assert math.isfinite(row["peak_mb"]) and row["peak_mb"] > 0 and row["train_s"] > 0


@pytest.mark.parametrize("family", ["sd35_medium", "sd35_medium_full"])
def test_real_width_trains_as_the_configs_load_and_measures_its_memory(family: str) -> None:
    row = real_width.run_family(family, threads=1, tiny=True)  # the tiny pipeline: this script's code path
    first, second = row["iterations"]
    assert first["finite"] and second["finite"] and second["zero_grad_tensors"] == 0
    assert first["logprob_deviation"] <= 1e-3  # bf16 compute
    assert math.isfinite(row["peak_rss_mb"]) and row["peak_rss_mb"] > 0
    if family.endswith("_full"):  # float32 masters keep every update bf16 weights would round away
        assert row["weights"] == "float32 masters, bfloat16 compute"
        assert first["lost_updates"] == 0 and first["changed_fraction"] > first["changed_fraction_if_bf16_weights"]
    else:
        assert row["weights"].endswith("LoRA over bfloat16 weights")


@pytest.mark.slow  # a fresh process per family, as a real-width run
def test_real_width_writes_its_report_with_a_memory_column(tmp_path: Path) -> None:
    out = tmp_path / "report"
    rows = real_width.main(["--tiny", "--families", "sd35_medium", "--out", str(out)])
    assert "error" not in rows[0] and rows[0]["peak_rss_mb"] > 0
    assert "| peak RSS (MB) |" in out.with_suffix(".md").read_text()


def test_gpu_sd35_without_a_gpu_says_how_to_run_it(capsys) -> None:
    if gpu_sd35.torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit):
        gpu_sd35.main([])
    assert "no GPU is visible" in capsys.readouterr().err


def test_gpu_sd35_measures_the_model_and_text_length_configs_sd35_trains() -> None:
    from lit_treegrpo.models.published import SD35_MEDIUM
    from lit_treegrpo.models.tiny import TinySD3Adapter

    # CLIP's 77 tokens and the 128 T5 tokens of SD3Adapter's default, which configs/sd35.yaml keeps
    assert gpu_sd35.TEXT_TOKENS == 77 + 128
    assert TinySD3Adapter(num_steps=1, guidance_scale=1.0).encode_prompts(["a"])["prompt_embeds"].shape[1] == 205
    assert gpu_sd35.SD35_MEDIUM is SD35_MEDIUM  # the published config (tests/models/test_real_configs.py)


def test_the_committed_real_width_run_covers_every_family_and_passed() -> None:
    # benchmarks/results/real_width.md / .json: the last run of benchmarks/real_width.py (minutes per family)
    report = json.loads((BENCH / "results" / "real_width.json").read_text())
    rows = {r["family"]: r for r in report["rows"]}
    assert sorted(rows) == sorted(real_width.FAMILIES)
    for family, row in rows.items():
        assert "error" not in row, family
        bf16 = row["weights"] != "float32"
        for it in row["iterations"]:
            assert it["finite"] and it["logprob_deviation"] <= (1e-3 if bf16 else 1e-5), family
        assert row["iterations"][1]["zero_grad_tensors"] == 0, family
        if family.endswith("_full"):  # float32 masters: every weight with a gradient moved
            first = row["iterations"][0]
            assert first["lost_updates"] == 0 and first["changed_fraction_if_bf16_weights"] < 0.5
    assert (BENCH / "results" / "real_width.md").read_text().count("\n| ") == len(rows) + 1  # header and one row each


def test_step_noise_scores_one_stochastic_step_at_a_time_for_any_adapter(tmp_path: Path) -> None:
    report = step_noise.main([
        "--out", str(tmp_path), "--adapter", "lit_treegrpo.models.tiny.TinySD3Adapter", "--adapter-kwargs",
        '{"guidance_scale": 1.0}', "--reward", "brightness", "--prompts", "animals", "--val-fraction", "0",
        "--num-prompts", "2", "--chains", "2", "--steps", "3", "--samplers",
        '[{"dynamics": "dance_sde", "noise_level": 0.3}, {"dynamics": "flow_sde", "noise_level": 0.7}, '
        '{"dynamics": "cps", "noise_level": 0.8}]',
    ])  # fmt: skip
    rows = report["rows"]
    # per sampler (CPS among them): the ODE row, one row per step 0 .. T-2, and all of them together
    assert [r["step"] for r in rows] == [None, 0, 1, "all"] * 3
    ode = [r for r in rows if r["step"] is None]
    # the deterministic samples start from the same noises whatever the SDE: equal across samplers
    assert ode[0]["per_prompt"] == ode[1]["per_prompt"]
    assert rows[1]["per_prompt"] != ode[0]["per_prompt"]  # a stochastic step changes the samples
    assert len(report["sigmas"]) == 4 and report["sigmas"][-1] == 0.0
    saved = json.loads((tmp_path / "step_noise.json").read_text())
    assert (tmp_path / "step_noise.md").read_text().strip() == step_noise.table(saved)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_training_estimate_follows_the_measured_peak_per_parent(checkpointing: bool) -> None:
    # the training guard's cost of a parent against the measured growth of a micro-batch's peak from
    # 1 to 4 parents (benchmarks/training_memory.py): within -15 % / +50 % on the tiny SD3 model
    import torch

    from lit_treegrpo.core.memory import training_memory as estimate
    from lit_treegrpo.core.spec import TreeSpec
    from lit_treegrpo.models.tiny import TinySD3Adapter
    from lit_treegrpo.training.memory_guard import probe_training

    adapter = TinySD3Adapter(num_steps=3, guidance_scale=1.0, gradient_checkpointing=checkpointing)
    saved = probe_training(
        adapter,
        TreeSpec(3, branch_steps=(0,), branching=2),
        adapter.encode_prompts(["a"]),
        adapter.initial_noise(1, torch.Generator().manual_seed(0)),
    )
    per_parent = estimate(
        saved, checkpointing=checkpointing, trainable_bytes=0, optimizer_state_bytes=0, held_bytes=0
    ).per_parent
    slope = (training_memory.measure(adapter, 4, 2) - training_memory.measure(adapter, 1, 2)) / 3
    assert 0.85 * slope < per_parent < 1.5 * slope, (per_parent, slope)
