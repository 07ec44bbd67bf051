"""The benchmarks' code paths, at toy sizes (their numbers come from real runs, see docs/benchmarks.md and docs/results.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_sd35  # noqa: E402
import real_width  # noqa: E402
import step_noise  # noqa: E402
import training_memory  # noqa: E402


@pytest.mark.slow  # the GPU benchmark on a tiny model, on CPU
def test_gpu_sd35_runs_its_code_path_on_a_tiny_transformer(capsys) -> None:
    results = gpu_sd35.main(["--tiny", "--device", "cpu", "--repeats", "1", "--methods", "treegrpo", "dancegrpo_g27"])
    assert results["treegrpo"]["leaves"] == results["dancegrpo_g27"]["leaves"] == 27
    assert results["treegrpo"]["nfe"] == 202 and results["dancegrpo_g27"]["nfe"] == 270
    assert results["treegrpo"]["train_forwards"] == 13  # one forward per branching node
    assert results["dancegrpo_g27"]["train_forwards"] == 27 * 6  # 60% of 9 SDE steps, 27 chains
    assert "speed-up vs dancegrpo_g27" in capsys.readouterr().out


@pytest.mark.slow  # the GPU benchmark's switches on a tiny model, on CPU
def test_gpu_sd35_switches_run_and_are_written(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    results = gpu_sd35.main(["--tiny", "--device", "cpu", "--repeats", "1", "--methods", "treegrpo",
                             "--precision", "bf16-mixed", "--prompt-cache", "--json", str(out)])  # fmt: skip
    written = json.loads(out.read_text())
    assert written["switches"]["precision"] == "bf16-mixed" and written["switches"]["prompt_cache"] is True
    assert written["methods"]["treegrpo"]["nfe"] == results["treegrpo"]["nfe"] == 202
    assert results["treegrpo"]["reward_s"] >= 0 and results["treegrpo"]["total_s"] > 0


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
