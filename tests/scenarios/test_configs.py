"""Every shipped run config parses and instantiates through the real CLI (``run=False``).

Only what would download is replaced: the adapters' ``_load`` (hub / local weights) returns the
tiny pipelines, and the reward loaders return tiny random rewards of the same kind. The trainer is
forced onto one CPU device, since FSDP and GPUs are not available here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_treegrpo import rewards
from lit_treegrpo.cli import TreeGRPOCLI
from lit_treegrpo.models import FluxAdapter, QwenImageAdapter, SD3Adapter, SD15Adapter, WanAdapter
from lit_treegrpo.models.shapes import ShapesAdapter, builtin_folder
from lit_treegrpo.models.tiny import tiny_flux_pipeline, tiny_sd3_pipeline, tiny_sd15_pipeline
from lit_treegrpo.models.tiny_qwen import tiny_qwen_image_pipeline
from lit_treegrpo.models.tiny_wan import tiny_wan_pipeline
from lit_treegrpo.shapes.pretrain import PretrainCLI, ShapesPretrainModule
from lit_treegrpo.training.module import TreeGRPOModule

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRETRAIN = CONFIGS / "shapes_pretrain.yaml"  # the Shapes model's own pre-training CLI
METHODS = sorted((CONFIGS / "methods").glob("*.yaml"))  # presets, composed with a model and task config
RUN_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "methods" and p != PRETRAIN)


@pytest.fixture
def offline_weights(monkeypatch, tmp_path):
    loaded: list[str] = []

    def sd15(path, dtype, revision, variant):
        loaded.append(path)
        return tiny_sd15_pipeline(0)

    def sd3(path, dtype, revision, variant, use_t5):
        loaded.append(path)
        return tiny_sd3_pipeline(0, with_t5=use_t5)

    def wan(path, dtype, revision, variant):
        loaded.append(path)
        return tiny_wan_pipeline(0)

    def flux(path, dtype, revision, variant):
        loaded.append(path)
        return tiny_flux_pipeline(0)

    def qwen_image(path, dtype, revision, variant):
        loaded.append(path)
        return tiny_qwen_image_pipeline(0)

    monkeypatch.setattr(SD15Adapter, "_load", staticmethod(sd15))
    monkeypatch.setattr(QwenImageAdapter, "_load", staticmethod(qwen_image))
    monkeypatch.setattr(FluxAdapter, "_load", staticmethod(flux))
    monkeypatch.setattr(SD3Adapter, "_load", staticmethod(sd3))
    monkeypatch.setattr(WanAdapter, "_load", staticmethod(wan))
    tiny = {
        "hps": rewards.HPSv2.tiny,
        "pickscore": rewards.PickScore.tiny,
        "clip_score": rewards.CLIPScore.tiny,
        "aesthetic": rewards.Aesthetic.tiny,
    }
    for name, make in tiny.items():
        monkeypatch.setitem(rewards.REWARDS, name, lambda make=make, **kw: make(tmp_path / "reward"))
    # ImageReward needs the image-reward extra (its own venv in CI): any frozen reward stands in
    monkeypatch.setitem(rewards.REWARDS, "image_reward", lambda **kw: rewards.Brightness())
    monkeypatch.delitem(rewards.REQUIREMENTS, "image_reward")  # the stand-in needs no extra
    return loaded


def test_no_shipped_config_states_the_number_of_steps_twice() -> None:
    # the adapter owns num_steps; the tree takes it (issue 22: one owner per setting)
    import yaml

    for path in sorted(CONFIGS.rglob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
        assert "num_steps" not in (model.get("tree") or {}), f"{path.name}: tree.num_steps (the adapter's already)"


def test_every_run_config_is_covered() -> None:
    names = {str(p.relative_to(CONFIGS)) for p in RUN_CONFIGS}
    assert {
        "tiny.yaml",
        "shapes.yaml",
        "sd15.yaml",
        "sd35.yaml",
        "sd35_large.yaml",
        "sd35_fsdp.yaml",
        "wan.yaml",
        "tiny_wan.yaml",
        "tiny_wan22.yaml",
        "flux.yaml",
        "tiny_flux.yaml",
        "qwen_image.yaml",
        "tiny_qwen_image.yaml",
    } <= names
    assert {p.stem for p in METHODS} == {
        "treegrpo",
        "treegrpo_softmax",
        "branchgrpo",
        "branchgrpo_pruned",
        "branchgrpo_mix",
        "dancegrpo",
        "flowgrpo",
        "mixgrpo",
        "treegrpo_official",
        "branchgrpo_official",
        "treegrpo_parent_relative",
        "treegrpo_tmpo",
        "treegrpo_mix_updates",
    }


@pytest.mark.parametrize("base", ["shapes.yaml", "sd35.yaml"])
@pytest.mark.parametrize("method", METHODS, ids=lambda p: p.stem)
def test_a_method_preset_composes_with_a_model_config(base: str, method: Path, offline_weights, tmp_path: Path) -> None:
    # fit --config configs/<base> --config configs/methods/<method>.yaml: the preset's method on that model
    import yaml

    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
    cli = TreeGRPOCLI(args=["--config", str(CONFIGS / base), "--config", str(method), *cpu,
                            "--trainer.default_root_dir", str(tmp_path)], run=False)  # fmt: skip
    preset = yaml.safe_load(method.read_text())["model"]
    assert (
        cli.model.tree.num_trees == preset["tree"]["num_trees"]
        and cli.model.update_settings.minibatches == preset["minibatches"]
    )
    assert cli.model.adapter.dynamics == preset["adapter"]["init_args"]["dynamics"]
    assert cli.model.loss_fn.clip_low == preset["loss"]["init_args"]["clip_range"]
    schedules = [c for c in cli.trainer.callbacks if type(c).__name__ == "PruningSchedule"]
    assert len(schedules) == ("callbacks+" in method.read_text())


@pytest.mark.parametrize("config", RUN_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_instantiates_through_the_cli(config: Path, offline_weights, tmp_path: Path) -> None:
    text = config.read_text()
    assert text.startswith("#") and "Launch: python -m lit_treegrpo fit --config" in text
    cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
    cli = TreeGRPOCLI(args=["--config", str(config), *cpu, "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert isinstance(cli.model, TreeGRPOModule)
    assert cli.model.tree.num_steps == cli.model.adapter.num_steps
    if isinstance(cli.model.adapter, ShapesAdapter):  # the shipped weights, through from_pretrained
        assert cli.model.adapter.source == str(builtin_folder())
    elif "pretrained:" in text:
        assert offline_weights, "the real loading path was not taken"
    checkpoint_dirs = [c.dirpath for c in cli.trainer.checkpoint_callbacks]
    assert checkpoint_dirs == [str(tmp_path / "checkpoints")]


def test_the_pretraining_config_instantiates_through_its_cli(tmp_path: Path) -> None:
    text = PRETRAIN.read_text()
    assert text.startswith("#") and "Launch: python -m lit_treegrpo.shapes.pretrain fit --config" in text
    cli = PretrainCLI(args=["--config", str(PRETRAIN), "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert isinstance(cli.model, ShapesPretrainModule)
    assert cli.datamodule.image_size == cli.model.config.image_size == 16
    assert cli.trainer.max_steps > 0
