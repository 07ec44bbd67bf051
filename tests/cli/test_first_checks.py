"""What the command line checks before it imports Lightning and the models: a real model's weights
first (naming the option and the folder layout), then the rewards' extras (with an install line
that keeps the README's torch), and the shipped configs' names (``--config shapes``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_treegrpo.cli.first_checks import FAMILIES, PRETRAINED, FirstCheckError, check_weights, resolve_config_names
from tests.cli.helpers import one_error_line

REPO = Path(__file__).resolve().parents[2]
#: the real-model configs and the diffusers pipeline whose folder layout each names
REAL = {"sd15": "StableDiffusionPipeline", "sd35": "StableDiffusion3Pipeline", "flux": "FluxPipeline",
        "qwen_image": "QwenImagePipeline", "wan": "WanPipeline", "sd35_fsdp": "StableDiffusion3Pipeline"}  # fmt: skip


@pytest.mark.parametrize("config", sorted(REAL))
def test_a_real_config_without_its_weights_names_the_option_and_the_layout(
    config: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    # HF_HUB_OFFLINE=1 (conftest) and an empty hub cache: the published weights cannot be had
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    line = one_error_line(capsys, monkeypatch, "fit", "--config", str(REPO / "configs" / f"{config}.yaml"),
                  "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert line.startswith(f"error: {PRETRAINED} "), line
    assert "not in the local hub cache and HF_HUB_OFFLINE is set" in line
    assert "(hf download " in line  # the CLI huggingface_hub >= 0.34 ships (this venv's is newer)
    assert f"a folder that {REAL[config]}.save_pretrained wrote (model_index.json, " in line
    assert not (tmp_path / "run").exists()  # nothing written


def test_the_weights_are_named_before_the_missing_extra_and_before_any_heavy_import(tmp_path: Path) -> None:
    """configs/sd15.yaml (ImageReward, an extra this venv lacks): the weights come first, in a
    process that has imported neither Lightning, diffusers nor torch when it stops."""
    code = (
        "import sys\n"
        "from lit_treegrpo.cli import main\n"
        "try:\n"
        f"    main(['fit', '--config', {str(REPO / 'configs' / 'sd15.yaml')!r}, '--trainer.default_root_dir', {str(tmp_path / 'run')!r}])\n"
        "except SystemExit as stop:\n"
        "    heavy = sorted(m for m in ('lightning', 'diffusers', 'transformers', 'torch') if m in sys.modules)\n"
        "    print('exit', stop.code, heavy)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("LIT_TREEGRPO_DEBUG", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.stdout.strip() == "exit 2 []", (done.stdout, done.stderr[-2000:])
    assert done.stderr.startswith(f"error: {PRETRAINED} stable-diffusion-v1-5/stable-diffusion-v1-5: "), done.stderr


def test_with_its_weights_in_place_the_missing_extra_is_next_with_the_readmes_torch(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    pytest.importorskip("diffusers")
    if _has_image_reward():
        pytest.skip("the image-reward extra is installed here")
    from lit_treegrpo.models.tiny import tiny_sd15_pipeline

    tiny_sd15_pipeline(0).save_pretrained(str(tmp_path / "sd15"))  # the layout the config's adapter loads
    capsys.readouterr()  # what building it printed
    line = one_error_line(capsys, monkeypatch, "fit", "--config", str(REPO / "configs" / "sd15.yaml"), PRETRAINED,
                  str(tmp_path / "sd15"), "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert line.startswith("error: --model.reward: reward 'image_reward' needs a package that is not installed"), line
    assert "pip install 'lit-treegrpo[image-reward]'" in line
    # the README's torch stays: a GPU box keeps its CUDA torch and adds that release's torchvision
    assert "on a GPU box the CUDA torch and its torchvision" in line and "torch==2.13.0" in line


def _has_image_reward() -> bool:
    import importlib.util

    return importlib.util.find_spec("ImageReward") is not None


def test_a_local_folder_must_have_the_pipelines_layout(tmp_path: Path) -> None:
    sd3 = {"class_path": "lit_treegrpo.models.SD3Adapter", "init_args": {"pretrained": str(tmp_path / "sd3")}}
    with pytest.raises(FirstCheckError, match=r"sd3: no such folder; give a folder that StableDiffusion3Pipeline"):
        check_weights({"adapter": sd3})
    (tmp_path / "sd3").mkdir()
    with pytest.raises(FirstCheckError, match="holds no model_index.json"):
        check_weights({"adapter": sd3})
    index = {"_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "SD3Transformer2DModel"],
             "vae": ["diffusers", "AutoencoderKL"], "text_encoder_3": [None, None]}  # fmt: skip
    (tmp_path / "sd3" / "model_index.json").write_text(json.dumps(index))
    (tmp_path / "sd3" / "transformer").mkdir()
    with pytest.raises(FirstCheckError, match=r"its model_index.json lists vae, which the folder lacks"):
        check_weights({"adapter": sd3})
    (tmp_path / "sd3" / "vae").mkdir()
    check_weights({"adapter": sd3})  # a component the index leaves out (None) needs no folder
    shapes = {"class_path": "lit_treegrpo.models.shapes.ShapesAdapter", "init_args": {"pretrained": str(tmp_path)}}
    with pytest.raises(
        FirstCheckError, match=r"lacks transformer/, text_encoder/, tokenizer/, scheduler/; give builtin"
    ):
        check_weights({"adapter": shapes})


@pytest.mark.slow  # builds and saves a tiny pipeline of every family
@pytest.mark.parametrize(
    ("family", "build"),
    [
        ("SD15Adapter", "lit_treegrpo.models.tiny:tiny_sd15_pipeline"),
        ("SD3Adapter", "lit_treegrpo.models.tiny:tiny_sd3_pipeline"),
        ("FluxAdapter", "lit_treegrpo.models.tiny:tiny_flux_pipeline"),
        ("QwenImageAdapter", "lit_treegrpo.models.tiny_qwen:tiny_qwen_image_pipeline"),
        ("WanAdapter", "lit_treegrpo.models.tiny_wan:tiny_wan_pipeline"),
    ],
)
def test_what_each_familys_pipeline_saves_passes_the_layout_check(tmp_path: Path, family: str, build: str) -> None:
    import importlib

    module, _, name = build.partition(":")
    getattr(importlib.import_module(module), name)(0).save_pretrained(str(tmp_path / "model"))
    assert json.loads((tmp_path / "model" / "model_index.json").read_text())["_class_name"] == FAMILIES[family][0]
    check_weights({"adapter": {"class_path": family, "init_args": {"pretrained": str(tmp_path / "model")}}})


def test_config_takes_the_name_of_a_shipped_config(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no configs/ here: the shipped ones are found by name
    shipped = REPO / "configs"
    argv = ["fit", "--config", "shapes", "-c", "methods/mixgrpo", "--config=configs/tiny.yaml"]
    assert resolve_config_names(argv) == [
        "fit", "--config", str(shipped / "shapes.yaml"), "-c", str(shipped / "methods" / "mixgrpo.yaml"),
        f"--config={shipped / 'tiny.yaml'}",
    ]  # fmt: skip
    (tmp_path / "shapes").write_text("seed_everything: 1\n")  # a file of that name is the file
    assert resolve_config_names(["--config", "shapes"]) == ["--config", "shapes"]
    with pytest.raises(
        FirstCheckError, match=r"--config shape: no such file, and no shipped config of that name \(shipped: .*shapes,"
    ):
        resolve_config_names(["--config", "shape"])
    with pytest.raises(FirstCheckError, match="no shipped config"):
        resolve_config_names(["--config", "../configs/shapes"])


@pytest.mark.parametrize(("version", "cli"), [("2.5.0", "hf"), ("0.34.1", "hf"), ("0.33.4", "huggingface-cli")])
def test_the_download_fix_names_the_cli_the_installed_hub_ships(monkeypatch, version: str, cli: str) -> None:
    import importlib.metadata

    from lit_treegrpo.common.hub import download_command

    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    assert download_command("org/model") == f"{cli} download org/model"
