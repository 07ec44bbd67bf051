"""Writes ``tiny_sd3_step2.ckpt``: two training steps of the tiny SD3 model, as the code of the
checkout this script runs in saves them. ``tests/training/test_module.py::test_a_checkpoint_written_before_the_module_split_resumes``
resumes it; the committed file was written by the code before TreeGRPOModule's settings, fault
ledger and helpers moved out of module.py (commit bd85ae5), so that test pins the checkpoint format.

    python tests/checkpoints/make_tiny_checkpoint.py tests/checkpoints
"""

from __future__ import annotations

import inspect
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import lightning as L
import torch

from lit_treegrpo.core import TreeSpec
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import RewardModel

try:  # the package grouped by concern
    from lit_treegrpo.training.faults import FaultPolicy
    from lit_treegrpo.training.module import TreeGRPOModule
except ImportError:  # the flat package: after the module split (settings.py), or before it
    from lit_treegrpo.module import TreeGRPOModule

    try:
        from lit_treegrpo.settings import FaultPolicy
    except ImportError:
        from lit_treegrpo.module import FaultPolicy

STEPS = 2
NAME = "tiny_sd3_step2.ckpt"


class RedIsNaN(RewardModel):
    """Mean brightness, NaN for the images of prompts that mention red (the skip policy drops them)."""

    name = "red_is_nan"

    def __init__(self) -> None:
        super().__init__()
        self.freeze()

    def score_batch(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        red = torch.tensor(["red" in p for p in prompts], device=images.device)  # [B]
        return torch.where(red, torch.full((images.shape[0],), float("nan")), images.mean(dim=(1, 2, 3)))


def model() -> TreeGRPOModule:
    # the committed file was written on the tiny model's SD3 (not SD3.5) blocks, before they had the
    # option: the blocks are chosen by it where it exists
    sd3 = {"sd35": False} if "sd35" in inspect.signature(TinySD3Adapter).parameters else {}
    return TreeGRPOModule(
        TinySD3Adapter(num_steps=3, guidance_scale=1.0, **sd3),
        reward=RedIsNaN(),
        tree=TreeSpec(3, branch_steps=(0, 1), branching=2),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5),  # no optimizer state: a small file
        faults=FaultPolicy(nonfinite="skip"),  # stops after 3 skipped steps in a row
    )


def data() -> PromptDataModule:
    return PromptDataModule("shapes", batch_size=2, val_size=0, val_fraction=0.0)


def trainer(root: Path, max_steps: int, **kwargs) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=root,
        **kwargs,
    )


def main(folder: str) -> None:
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp, save_last=True)
        trainer(Path(tmp), STEPS, callbacks=[checkpoint]).fit(model(), data())
        shutil.copy(Path(tmp) / "last.ckpt", Path(folder) / NAME)


if __name__ == "__main__":
    main(sys.argv[1])
