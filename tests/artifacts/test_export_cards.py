"""Every family's export card runs as written, in a fresh Python process, and loads what the docs
promise: the family's plain diffusers pipeline holding the trained weights, or, for the Shapes model
(no diffusers pipeline), the project's ShapesAdapter, whose sampler then draws the trained images.
Every file an export writes is as readable as the card itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_treegrpo.core import TreeSpec

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["a red circle", "a blue square"]  # the Shapes card's own prompts


def _shapes() -> Any:
    from lit_treegrpo.models.shapes import ShapesAdapter

    return ShapesAdapter(num_steps=4)  # the shipped weights


def _tiny(module: str, name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)(num_steps=4, **kwargs)

    return build


#: family -> its adapter (the Shapes model's shipped weights, or a tiny model of the family's shape)
FAMILIES = {
    "shapes": _shapes,
    "sd15": _tiny("lit_treegrpo.models.tiny", "TinySD15Adapter"),
    "sd3": _tiny("lit_treegrpo.models.tiny", "TinySD3Adapter"),
    "flux": _tiny("lit_treegrpo.models.tiny", "TinyFluxAdapter"),
    "qwen_image": _tiny("lit_treegrpo.models.tiny_qwen", "TinyQwenImageAdapter"),
    "wan": _tiny("lit_treegrpo.models.tiny_wan", "TinyWanAdapter"),
    "wan22": _tiny("lit_treegrpo.models.tiny_wan", "TinyWan22Adapter", kind="a14b", train_experts="both"),
}
#: what the test reads back after the card's snippet ran: the Shapes model's samples, or every
#: denoiser of the pipeline with any loaded LoRA fused in (the trained weights, whatever their format)
READ_BACK = """
import torch
if "images" in globals():
    torch.save(images, os.environ["CARD_RESULT"])
else:
    subs = [s for s in ("unet", "transformer", "transformer_2") if getattr(pipe, s, None) is not None]
    if any("lora_" in k for s in subs for k in getattr(pipe, s).state_dict()):
        pipe.fuse_lora(components=subs)
        pipe.unload_lora_weights()
    torch.save({f"{s}.{k}": v for s in subs for k, v in getattr(pipe, s).state_dict().items()}, os.environ["CARD_RESULT"])
"""


def _exported(family: str, folder: Path, *, merged: bool) -> Any:
    """An export of a model of ``family`` whose LoRA moved away from its zero start; returns the module."""
    from lit_treegrpo.artifacts.export import export
    from lit_treegrpo.training.module import TreeGRPOModule

    adapter = FAMILIES[family]()
    torch.manual_seed(0)
    with torch.no_grad():  # trained weights: far enough from the base that loading them shows
        for p in adapter.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    reward = "temporal_consistency" if adapter.makes_video else "brightness"
    module = TreeGRPOModule(adapter, reward, TreeSpec(adapter.num_steps, branch_steps=(0,), branching=2))
    export(module, folder, merged=merged)
    return module


def _run_card(folder: Path, result: Path) -> None:
    """The card's snippet exactly as written, then :data:`READ_BACK`, in a fresh process outside
    the repository."""
    card = json.loads((folder / "export.json").read_text())
    assert card["load"] in (folder / "README.md").read_text()
    env = {**os.environ, "CARD_RESULT": str(result), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    code = "import os\n" + card["load"] + "\n" + READ_BACK
    done = subprocess.run([sys.executable, "-c", code], cwd=folder.parent, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, f"the card's snippet failed:\n{card['load']}\n{done.stderr[-3000:]}"


def _check_card(family: str, tmp_path: Path, merged: bool) -> None:
    from lit_treegrpo.artifacts.export import _merged
    from lit_treegrpo.shapes.pretrain import sample

    folder = tmp_path / ("merged" if merged else "lora")
    module = _exported(family, folder, merged=merged)
    adapter = module.adapter
    written = [p for p in folder.rglob("*") if p.is_file()]
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in written}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as the card
    assert (folder / "export.json").stat().st_mode & 0o044 == 0o044  # group and others may read (umask 022)
    card = json.loads((folder / "export.json").read_text())
    assert card["load"].startswith(f"DIR = {json.dumps(str(folder.resolve()))}")  # complete: it names its folder

    result = tmp_path / "result.pt"
    _run_card(folder, result)
    theirs = torch.load(result, weights_only=True)
    if family == "shapes":
        assert "from diffusers" not in card["load"]  # the project's own sampler
        with torch.no_grad():
            ours = sample(adapter, PROMPTS, seed=0)
            with adapter.reference():  # the base model: the card must not draw it
                base = sample(adapter, PROMPTS, seed=0)
        assert (ours - base).abs().max() > 1e-3
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
        return
    pipeline = type(adapter.pipeline).__name__
    assert f"{pipeline}" in card["load"] or adapter.base_pipeline_code[1] in card["load"]
    trained = {
        f"{sub}.{k}": v
        for sub, d in adapter.trained_denoisers().items()
        for k, v in _merged(adapter, d).state_dict().items()
    }
    fresh = FAMILIES[family]()  # the base model, built again from its seed
    base = {
        f"{sub}.{k}": v
        for sub, d in fresh.trained_denoisers().items()
        for k, v in _merged(fresh, d).state_dict().items()
    }
    assert trained.keys() == base.keys() and trained.keys() <= theirs.keys()
    assert any(not torch.allclose(trained[k], base[k], atol=1e-4) for k in trained)  # the training shows
    for key in trained:
        torch.testing.assert_close(theirs[key], trained[key], atol=1e-6, rtol=1e-5, msg=key)


@pytest.mark.parametrize("merged", [False, True], ids=["lora", "merged"])
def test_the_shapes_cards_snippet_runs_as_written_and_draws_the_trained_model(tmp_path: Path, merged: bool) -> None:
    _check_card("shapes", tmp_path, merged)


@pytest.mark.slow  # a fresh process per card and family: about 10 s each on 2 shared cores
@pytest.mark.parametrize("merged", [False, True], ids=["lora", "merged"])
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "shapes"])
def test_each_familys_card_runs_as_written_and_loads_the_trained_weights_into_its_pipeline(
    tmp_path: Path, family: str, merged: bool
) -> None:
    _check_card(family, tmp_path, merged)


def test_the_card_names_the_losss_options_and_the_export_prints_no_empty_float32_note(tmp_path: Path) -> None:
    import logging

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    library, keep = logging.getLogger("diffusers"), Keep()  # where diffusers' module loggers propagate
    library.addHandler(keep)
    try:
        _exported("shapes", tmp_path / "lora", merged=False)  # diffusers' save_lora_adapter casts with dtype=None
    finally:
        library.removeHandler(keep)
    assert not [m for m in seen if "kept in float32" in m], seen
    loss = json.loads((tmp_path / "lora" / "export.json").read_text())["method"]["loss"]
    assert loss == {"clip_range": 1e-4, "clip_range_high": 1e-4, "adv_clip": 5.0, "kl_beta": 0.0, "kl_form": "exact",
                    "aggregation": "sum"}  # fmt: skip


def test_the_docs_show_the_main_jobs_card_as_export_writes_it(tmp_path: Path) -> None:
    import re

    from lit_treegrpo.artifacts.export import how_to_load
    from lit_treegrpo.models.shapes import ShapesAdapter

    page = (REPO / "docs" / "after_training.md").read_text()
    (shown,) = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "ShapesAdapter" in b]
    card = how_to_load(ShapesAdapter(), lora=True, base="builtin", folder=tmp_path)  # configs/shapes.yaml's options
    assert card.splitlines()[0] == f"DIR = {json.dumps(str(tmp_path.resolve()))}  # this export's folder"
    assert shown.splitlines()[1:] == card.splitlines()[1:]
