"""After training: export, captioned grids and tree views on the iteration axis, progress lines in a
log file, EMA weights in validate, --max_iterations. One real fit of configs/tiny.yaml (4
iterations of 2 optimizer steps each, EMA, grids and tree views every 2) serves most tests."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from lit_treegrpo.artifacts.run_folder import event_folder

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"
SHAPES = REPO / "configs" / "shapes.yaml"
EXTRA = """\
trainer:
  callbacks:
    - class_path: lit_treegrpo.callbacks.RewardMetrics
    - class_path: lit_treegrpo.callbacks.EMA
      init_args: {decay: 0.5}
    - class_path: lit_treegrpo.callbacks.SampleGridLogger
      init_args: {prompts: ["a red circle", "a blue square"], seeds: [0, 1], every_n_steps: 2}
    - class_path: lit_treegrpo.callbacks.TreeView
      init_args: {prompt: "a green triangle", every_n_steps: 2}
"""
RUN = ("--max_iterations", "4", "--model.minibatches", "2", "--trainer.val_check_interval", "2",
       "--trainer.enable_model_summary", "false")  # fmt: skip


def _main(*args: str) -> None:
    from lit_treegrpo.cli import main

    main(list(args))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A fit of the tiny config with its stdout written to ``<root>/stdout.txt`` (not a terminal)."""
    root = tmp_path_factory.mktemp("tiny_run")
    (root / "extra.yaml").write_text(EXTRA)
    with open(root / "stdout.txt", "w") as out, contextlib.redirect_stdout(out):
        _main("fit", "--config", str(TINY), "--config", str(root / "extra.yaml"), "--trainer.default_root_dir",
              str(root), *RUN)  # fmt: skip
    return root


def _events(root: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(event_folder(root / "tensorboard")), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


def test_fit_with_stdout_to_a_file_prints_progress_lines(tiny_run: Path) -> None:
    lines = (tiny_run / "stdout.txt").read_text().splitlines()
    assert lines[0] == "training from iteration 0 to iteration 4"
    assert any(line.startswith("iteration 1/4  reward ") and " s/it  ETA " in line for line in lines), lines
    assert any(line.startswith("iteration 4/4  reward ") for line in lines), lines
    assert [line.split("  ")[0] for line in lines if "held-out reward" in line] == [
        "iteration 0/4",  # the base model, before the first update (validate_at_start)
        "iteration 2/4",
        "iteration 4/4",
    ]
    assert lines[-1].startswith("finished at iteration 4: 4 iterations in ")
    assert not any("\r" in line or "━" in line for line in lines)  # no progress bar drawn into the file


def _shape(line: str) -> str:
    """A progress line with its durations and numbers blanked: what a docs example must share."""
    return re.sub(r"\d+(\.\d+)?", "N", re.sub(r"\b(\d+h )?(\d+m )?\d+s\b", "D", line))


def test_the_docs_progress_lines_are_the_lines_the_program_prints(tiny_run: Path) -> None:
    printed = {_shape(line) for line in (tiny_run / "stdout.txt").read_text().splitlines()}
    text = (REPO / "docs" / "after_training.md").read_text()
    block = text.split("replaced by plain lines", 1)[1].split("```\n", 2)[1]  # the first fenced block after it
    documented = [line for line in block.splitlines() if line != "..."]
    assert len(documented) == 6 and [line for line in documented if _shape(line) not in printed] == []


def test_scalars_and_images_share_the_iteration_axis(tiny_run: Path) -> None:
    events = _events(tiny_run)
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    images = {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()["images"]}
    # a training step's metrics at its index (the weights that sampled it had seen that many
    # updates); validations, grids and tree views at the number of completed iterations
    assert steps["reward"] == steps["loss"] == steps["reward/mean"] == [0, 1, 2, 3]
    assert steps["val/reward"] == [0, 2, 4]  # the base model first (validate_at_start)
    assert all(steps[tag][0] == 0 for tag in steps if tag.startswith("val/")), steps
    assert images["samples"] == images["tree"] == [0, 2, 4]
    # Lightning's optimizer-step count is a scalar of its own (2 per iteration), not the x-axis
    assert [(e.step, e.value) for e in events.Scalars("optimizer_steps")] == [(0, 2.0), (1, 4.0), (2, 6.0), (3, 8.0)]
    assert [e.value for e in events.Scalars("iteration")] == [1.0, 2.0, 3.0, 4.0]


def test_tensorboard_names_the_run_and_lists_the_rewards_first(tiny_run: Path) -> None:
    """TensorBoard groups tags by the part before the first ``/`` and sorts the groups by name
    (character codes, digits and ``_`` first): the headline group sorts before every other."""
    # the run is listed by what it trains: the tiny SD3, a k=2 tree, mean backup, brightness
    assert event_folder(tiny_run / "tensorboard").name == "tinysd3_tree-k2_mean_brightness"
    events = _events(tiny_run)
    tags = events.Tags()["scalars"]
    groups = sorted({tag.split("/", 1)[0] for tag in tags})
    assert groups[0] == "Reward" and not any(g[0].isdigit() or g[0] == "_" for g in groups), groups
    assert [e.value for e in events.Scalars("Reward/train")] == [e.value for e in events.Scalars("reward")]
    assert [(e.step, e.value) for e in events.Scalars("Reward/held_out")] == [
        (e.step, e.value) for e in events.Scalars("val/reward")
    ]


def test_the_grid_is_captioned_and_the_tree_view_drawn(tiny_run: Path) -> None:
    import numpy as np
    from PIL import Image

    from lit_treegrpo.callbacks import make_grid

    grid = np.asarray(Image.open(tiny_run / "samples" / "step_000002.png"))  # [H, W, 3]
    plain = make_grid(torch.zeros(2, 2, 3, 32, 32))  # the uncaptioned layout of 2 prompts x 2 seeds
    assert grid.shape[0] > plain.shape[1] and grid.shape[1] > plain.shape[2] + 100  # a prompt column, labels
    prompt_column = grid[20:60, :140]  # where "a red circle" is written, left of row 0
    assert (prompt_column.min(axis=2) < 100).sum() > 30  # dark text pixels on the white column
    assert (tiny_run / "samples" / "tree_000002.png").is_file()
    tree = np.asarray(Image.open(tiny_run / "samples" / "tree_000004.png"))
    assert tree.shape[0] > 150 and tree.shape[1] >= 420
    # the tiny tree has 4 leaves: their images (32 px) sit in one row under the edges
    events = _events(tiny_run)
    assert events.Images("tree")[-1].width == tree.shape[1]


def test_export_of_the_tiny_config_loads_in_a_fresh_pipeline(tiny_run: Path, tmp_path: Path) -> None:
    from lit_treegrpo.artifacts.export import ema_state, restore, swapped_in
    from lit_treegrpo.cli import TreeGRPOCLI
    from lit_treegrpo.models.tiny import tiny_sd3_pipeline

    base = ["--config", str(TINY), "--trainer.default_root_dir", str(tiny_run)]
    _main("export", *base, "--out", str(tmp_path / "lora"), "--ema", "true")
    _main("export", *base, "--ckpt_path", str(tiny_run / "checkpoints" / "last.ckpt"), "--out", str(tmp_path / "full"),
          "--merged", "true")  # fmt: skip
    card = json.loads((tmp_path / "lora" / "export.json").read_text())
    assert card["iterations"] == 4 and card["optimizer_steps"] == 8 and card["weights"] == "LoRA"
    assert card["base_model"] == "TinySD3Adapter(seed=0)" and card["method"]["advantage"]["method"] == "mean"
    assert card["method"]["pruning"] is None  # configs/tiny.yaml has no PruningSchedule
    assert card["reward"] is not None and card["held_out_reward"] is not None and card["ema"]["num_updates"] == 4
    assert "pipe.load_lora_weights(DIR)" in (tmp_path / "lora" / "README.md").read_text()

    # the adapter with the checkpoint's weights, as the run would sample
    cli = TreeGRPOCLI(args=[*base, "--trainer.logger", "false"], run=False)
    checkpoint = torch.load(tiny_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    restore(cli.model, checkpoint)
    adapter = cli.model.adapter
    cond = adapter.encode_prompts(["a red circle"])
    x = adapter.initial_noise(1, torch.Generator().manual_seed(3))
    with torch.no_grad():
        trained = adapter.predict(x, 1, cond)
        pipe = tiny_sd3_pipeline(seed=0)  # a fresh base pipeline
        adapter.denoiser, own = pipe.transformer, adapter.denoiser
        untrained = adapter.predict(x, 1, cond)
        pipe.load_lora_weights(str(tmp_path / "lora"))
        loaded = adapter.predict(x, 1, cond)
        from diffusers import SD3Transformer2DModel

        adapter.denoiser = SD3Transformer2DModel.from_pretrained(str(tmp_path / "full"), subfolder="transformer")
        merged = adapter.predict(x, 1, cond)
        ema_pipe = tiny_sd3_pipeline(seed=0)
        ema_pipe.load_lora_weights(str(tmp_path / "lora" / "ema"))
        adapter.denoiser = ema_pipe.transformer
        ema_loaded = adapter.predict(x, 1, cond)
        adapter.denoiser = own
        with swapped_in(adapter.trainable_parameters(), ema_state(checkpoint)["shadows"]):
            ema_trained = adapter.predict(x, 1, cond)
    assert not torch.allclose(untrained, trained, atol=1e-4)  # the LoRA moved the model
    torch.testing.assert_close(loaded, trained, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(merged, trained, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(ema_trained, trained, atol=1e-6)  # decay 0.5 lags the weights
    torch.testing.assert_close(ema_loaded, ema_trained, atol=1e-5, rtol=1e-4)


def test_each_cards_snippet_loads_the_export_into_a_plain_pipeline_that_draws_the_adapters_images(
    tiny_run: Path, tmp_path: Path
) -> None:
    from lit_treegrpo.artifacts.export import restore
    from lit_treegrpo.cli import TreeGRPOCLI
    from lit_treegrpo.core import TreeSpec, rollout

    base = ["--config", str(TINY), "--trainer.default_root_dir", str(tiny_run)]
    _main("export", *base, "--out", str(tmp_path / "lora"))
    _main("export", *base, "--out", str(tmp_path / "merged"), "--merged", "true")
    cli = TreeGRPOCLI(args=[*base, "--trainer.logger", "false"], run=False)
    restore(cli.model, torch.load(tiny_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True))
    adapter, prompts = cli.model.adapter, ["a red circle", "a blue square"]
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(3))
    with torch.no_grad():  # the trained adapter's deterministic samples
        cond = adapter.encode_prompts(prompts)
        ours = adapter.decode(
            rollout(adapter.predict, adapter.step, TreeSpec(adapter.num_steps), cond, noise).leaf_latents
        )
    for folder in ("lora", "merged"):
        card = json.loads((tmp_path / folder / "export.json").read_text())
        assert (
            "tiny_sd3_pipeline(seed=0, with_t5=True, sd35=True)" in card["load"]
            and "TinySD3Adapter(" not in card["load"]
        )
        assert card["load"] in (tmp_path / folder / "README.md").read_text()
        scope = {"DIR": str(tmp_path / folder)}
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no second adapter beside a LoRA the pipeline had
            exec(card["load"], scope)  # the card's snippet, as written
        pipe = scope["pipe"]
        pipe.set_progress_bar_config(disable=True)
        theirs = pipe(prompt=prompts, latents=noise.clone(), num_inference_steps=adapter.num_steps,
                      guidance_scale=adapter.guidance_scale, output_type="pt", max_sequence_length=128).images  # fmt: skip
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0, msg=folder)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--ckpt_path", "/no/such.ckpt", "--out", "OUT"],
            "--ckpt_path: no checkpoint at /no/such.ckpt; check the path",
        ),
        pytest.param(["--out", "OUT"], "--ckpt_path last: no checkpoint at", marks=pytest.mark.slow),
        pytest.param(["--ckpt_path", "CKPT"], "--out: give the folder to write the export to", marks=pytest.mark.slow),
        pytest.param(["--ckpt_path", "CKPT", "--out", "CKPT"], "is a file; give a folder", marks=pytest.mark.slow),
        (["--ckpt_path", "CKPT", "--out", "FULL"], "the folder holds files and no earlier export"),
        pytest.param(["--ckpt_path", "GARBAGE", "--out", "OUT"], "--ckpt_path", marks=pytest.mark.slow),
    ],
)
def test_bad_export_options_are_one_line(
    tiny_run: Path, tmp_path: Path, capsys, monkeypatch, args: list[str], message: str
) -> None:
    from lit_treegrpo.models import tiny

    monkeypatch.delenv("LIT_TREEGRPO_DEBUG", raising=False)
    monkeypatch.setattr(tiny, "tiny_sd3_pipeline", lambda *a, **k: pytest.fail("a model was built before the check"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
    names = {
        "OUT": tmp_path / "out",
        "CKPT": tiny_run / "checkpoints" / "last.ckpt",
        "FULL": tmp_path / "full",
        "GARBAGE": tmp_path / "garbage.ckpt",
    }
    args = [str(names.get(a, a)) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        _main("export", "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path / "run"), *args)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert message in errors[0], errors[0]
    assert not (tmp_path / "out").exists() and (tmp_path / "full" / "notes.txt").read_text() == "mine"


def test_an_export_over_an_earlier_one_needs_overwrite_and_keeps_the_users_files(
    tiny_run: Path, tmp_path: Path, capsys, monkeypatch, caplog
) -> None:
    base = ["--config", str(TINY), "--trainer.default_root_dir", str(tiny_run), "--out", str(tmp_path / "exp")]
    _main("export", *base)
    (tmp_path / "exp" / "notes.txt").write_text("the user's notes")
    before = {p.name: p.read_bytes() for p in (tmp_path / "exp").iterdir()}
    monkeypatch.delenv("LIT_TREEGRPO_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        _main("export", *base, "--merged", "true")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(errors) == 1, errors
    assert "holds an earlier export (export.json); give a new or empty folder, or pass --overwrite true" in errors[0]
    assert {p.name: p.read_bytes() for p in (tmp_path / "exp").iterdir()} == before  # refused: nothing touched
    caplog.set_level("INFO")
    _main("export", *base, "--merged", "true", "--overwrite", "true")
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == [
        "README.md",
        "export.json",
        "notes.txt",
        "transformer",
    ]
    assert (tmp_path / "exp" / "notes.txt").read_text() == "the user's notes"
    assert json.loads((tmp_path / "exp" / "export.json").read_text())["weights"] == "full denoiser (LoRA merged)"
    assert "replaced the earlier export; kept notes.txt, which no export wrote" in caplog.text


def test_export_with_another_adapter_says_to_give_the_runs_adapter_not_to_resume(
    tiny_run: Path, tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    monkeypatch.delenv("LIT_TREEGRPO_DEBUG", raising=False)
    with pytest.raises(SystemExit):
        _main("export", "--config", str(TINY), "--trainer.default_root_dir", str(tiny_run), "--out", str(tmp_path / "x"),
              "--model.adapter", "lit_treegrpo.models.tiny.TinySD15Adapter", "--model.adapter.init_args.num_steps", "4")  # fmt: skip
    line = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")][0]
    assert line.startswith(
        f"error: --model.adapter: the checkpoint {tiny_run / 'checkpoints' / 'last.ckpt'} was trained with "
        "TinySD3Adapter, this run has TinySD15Adapter; give --model.adapter TinySD3Adapter as the run did"
    ), line
    assert "resume" not in line and "--overwrite" not in line and not (tmp_path / "x").exists()


def _val_reward(*args: str) -> float:
    from lit_treegrpo.cli import TreeGRPOCLI

    cli = TreeGRPOCLI(args=["validate", "--config", str(TINY), "--trainer.enable_progress_bar", "false",
                            "--trainer.enable_model_summary", "false", *args])  # fmt: skip
    return float(cli.trainer.callback_metrics["val/reward"])


def test_validate_from_a_checkpoint_uses_its_ema_weights(tiny_run: Path, tmp_path: Path) -> None:
    fitted = [e for e in _events(tiny_run).Scalars("val/reward") if e.step == 4][0].value  # fit's, with the EMA
    # configs/tiny.yaml has no EMA callback: the checkpoint's EMA state is found and used
    common = ("--ckpt_path", str(tiny_run / "checkpoints" / "last.ckpt"), "--trainer.default_root_dir", str(tmp_path))
    assert _val_reward(*common) == pytest.approx(fitted, abs=1e-6)
    raw = _val_reward(*common, "--raw_weights", "true")
    assert raw != pytest.approx(fitted, abs=1e-6)  # decay 0.5: the average lags the weights


@pytest.mark.slow  # a fit of its own (8 s)
def test_the_views_and_the_axis_leave_training_unchanged(tiny_run: Path, tmp_path: Path) -> None:
    from lit_treegrpo.cli import TreeGRPOCLI

    # the same run without EMA, grids, tree views, validation or progress lines
    cli = TreeGRPOCLI(args=["fit", "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path), *RUN,
                            "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
                            "--trainer.callbacks", "[]"])  # fmt: skip
    assert cli.model.iteration == 4 and cli.trainer.global_step == 8  # --max_iterations, not the config's max_steps: 30
    plain = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    viewed = torch.load(tiny_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert plain.keys() == viewed.keys()
    for name in plain:
        assert torch.equal(plain[name], viewed[name]), name


@pytest.mark.slow  # a Shapes fit and three model loads (~20 s)
def test_export_of_the_shapes_config_loads_in_shapes_adapter(tmp_path: Path) -> None:
    from diffusers import SD3Transformer2DModel

    from lit_treegrpo.artifacts.export import restore
    from lit_treegrpo.cli import TreeGRPOCLI
    from lit_treegrpo.models.shapes import ShapesAdapter, builtin_folder

    base = ["--config", str(SHAPES), "--trainer.default_root_dir", str(tmp_path / "run")]
    _main("fit", *base, "--max_iterations", "1", "--data.batch_size", "1", "--trainer.limit_val_batches", "0",
          "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false")  # fmt: skip
    _main("export", *base, "--out", str(tmp_path / "lora"))
    _main("export", *base, "--out", str(tmp_path / "full"), "--merged", "true")
    assert json.loads((tmp_path / "full" / "export.json").read_text())["weights"] == "full denoiser (LoRA merged)"

    cli = TreeGRPOCLI(args=[*base, "--trainer.logger", "false"], run=False)
    restore(
        cli.model, torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    )
    adapter = cli.model.adapter
    cond = adapter.encode_prompts(["a red circle on the left"])
    x = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    with torch.no_grad():
        trained = adapter.predict(x, 3, cond)
        fresh = ShapesAdapter(pretrained=str(tmp_path / "full"), num_steps=10)  # the merged export, as a base
        merged = fresh.predict(x, 3, fresh.encode_prompts(["a red circle on the left"]))
        transformer = SD3Transformer2DModel.from_pretrained(str(builtin_folder()), subfolder="transformer")
        transformer.load_lora_adapter(
            str(tmp_path / "lora"), prefix=None, weight_name="pytorch_lora_weights.safetensors"
        )
        adapter.denoiser, own = transformer, adapter.denoiser
        loaded = adapter.predict(x, 3, cond)
        adapter.denoiser = SD3Transformer2DModel.from_pretrained(str(builtin_folder()), subfolder="transformer")
        untrained = adapter.predict(x, 3, cond)
        adapter.denoiser = own
    assert not torch.allclose(untrained, trained, atol=1e-5)  # one iteration moved the LoRA
    torch.testing.assert_close(merged, trained, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loaded, trained, atol=1e-5, rtol=1e-4)


def test_validate_in_a_run_folder_without_ckpt_path_says_which_weights_it_scores(
    tiny_run: Path, tmp_path: Path, caplog
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # validate logs into its folder; the module's run stays as it was
    with caplog.at_level(logging.INFO):
        _main("validate", "--config", str(TINY), "--trainer.default_root_dir", str(run), "--trainer.logger", "false")
    said = [r.getMessage() for r in caplog.records if "no --ckpt_path" in r.getMessage()]
    assert said == [
        "validate: no --ckpt_path, so this scores the configured model's own weights (the base model), not the "
        f"run in {run}; add --ckpt_path last to score its {run / 'checkpoints' / 'last.ckpt'}"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO):  # with the run's checkpoint: nothing to say
        _main("validate", "--config", str(TINY), "--trainer.default_root_dir", str(run), "--trainer.logger", "false",
              "--ckpt_path", "last")  # fmt: skip
    assert not [r for r in caplog.records if "no --ckpt_path" in r.getMessage()]
