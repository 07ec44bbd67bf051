"""Pre-training of the Shapes model: a seeded Lightning run that exports a loadable model folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lit_treegrpo.models.shapes import ShapesAdapter
from lit_treegrpo.shapes.pretrain import SceneStream, main

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "--model.model.num_layers", "2", "--model.model.num_attention_heads", "2", "--model.model.attention_head_dim", "8",
    "--model.model.text_layers", "1", "--model.model.text_width", "16", "--model.eval_samples", "8",
    "--model.eval_steps", "3", "--data.batch_size", "8", "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def pretrain_args(root: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(REPO / "configs" / "shapes_pretrain.yaml"), *SMALL,
            "--trainer.default_root_dir", str(root), "--model.export_dir", str(root / "model"), *extra]  # fmt: skip


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return {
        **load_file(folder / "transformer" / "diffusion_pytorch_model.safetensors"),
        **{f"text.{k}": v for k, v in load_file(folder / "text_encoder" / "model.safetensors").items()},
    }


def test_the_scene_stream_is_a_pure_function_of_seed_and_index() -> None:
    a, b = SceneStream(16, 64, 5, 0.25, 0.5, 0.5), SceneStream(16, 64, 5, 0.25, 0.5, 0.5, start_index=3)
    assert torch.equal(a.batch(3).images, next(iter(b)).images) and a.batch(3).prompts == next(iter(b)).prompts
    assert not torch.equal(a.batch(3).images, a.batch(4).images)
    batch = a.batch(0)
    assert batch.images.shape == (64, 3, 16, 16) and batch.images.min() >= -1 and batch.images.max() <= 1
    dropped = sum(p == "" for k in range(10) for p in a.batch(k).prompts)
    assert 0.15 < dropped / 640 < 0.35  # caption_dropout 0.25


@pytest.mark.slow  # two pretraining runs
def test_pretraining_is_reproducible_from_its_seed_and_exports_a_loadable_model(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, "-m", "lit_treegrpo.shapes.pretrain", *pretrain_args(tmp_path / "a")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Shapes model written to" in run.stdout + run.stderr
    main(pretrain_args(tmp_path / "b"))  # the same seed, in this process
    main(pretrain_args(tmp_path / "c", "--model.seed", "1"))
    a, b, c = (weights(tmp_path / x / "model") for x in "abc")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    adapter = ShapesAdapter(tmp_path / "a" / "model", num_steps=3)
    images = adapter.decode(adapter.initial_noise(2))
    assert images.shape == (2, 3, 16, 16)
    meta = (tmp_path / "a" / "model" / "shapes_world.json").read_text()
    assert '"steps": 4' in meta and '"colour_acc"' in meta


def test_mismatched_image_sizes_are_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(pretrain_args(tmp_path, "--data.image_size", "8"))
    assert stop.value.code == 2
    assert "error: --data.image_size=8 but --model.model.image_size=16" in capsys.readouterr().err


def test_an_earlier_model_folder_is_never_written_over_and_duplicate_keys_are_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "shapes_world.json").write_text("an earlier pre-training's model")
    with pytest.raises(SystemExit) as stop:
        main(pretrain_args(tmp_path))
    assert stop.value.code == 2
    assert re.search(
        r"^error: --model.export_dir .*model: holds files .*give a new or empty folder", capsys.readouterr().err, re.M
    )
    assert (tmp_path / "model" / "shapes_world.json").read_text() == "an earlier pre-training's model"
    (tmp_path / "twice.yaml").write_text("trainer:\n  max_steps: 3\n  max_steps: 5\n")
    with pytest.raises(SystemExit) as stop:
        main([*pretrain_args(tmp_path / "b"), "--config", str(tmp_path / "twice.yaml")])
    assert stop.value.code == 2
    assert "the key 'max_steps' is given twice in one mapping, at lines 2 and 3" in capsys.readouterr().err
