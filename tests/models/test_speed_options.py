"""Options that make the denoiser faster without changing what it computes beyond float rounding:
``compile`` (every adapter: ``torch.compile`` of the denoiser, here with the CPU's inductor
backend) and ``channels_last`` (the SD 1.5 UNet's convolutions)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_treegrpo.core import TreeSpec, rollout
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.tiny import TinySD3Adapter, TinySD15Adapter
from lit_treegrpo.rewards import Brightness
from lit_treegrpo.training.module import TreeGRPOModule

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)
PROMPTS = ["a red circle", "a blue square"]
#: float32 rounding of reordered kernels on latents up to ~16 in size, where one float32 step is
#: ~1e-6 (measured: channels-last up to 2e-5 apart, compiled 7e-7)
ROUNDING = dict(rtol=0, atol=1e-4)


def _tree(adapter):
    cond = adapter.encode_prompts(PROMPTS)
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(0))
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    return rollout(adapter.predict, adapter.step, SPEC, cond, noise, generator=gens)


def test_channels_last_unet_draws_the_same_trees() -> None:
    eager, fast = TinySD15Adapter(num_steps=3), TinySD15Adapter(num_steps=3, channels_last=True)
    conv = next(m for m in fast.denoiser.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    a, b = _tree(eager), _tree(fast)
    torch.testing.assert_close(b.leaf_latents, a.leaf_latents, **ROUNDING)
    torch.testing.assert_close(b.edge_old_log_prob, a.edge_old_log_prob, rtol=0, atol=1e-4)


@pytest.mark.slow  # the inductor compiles the forward and backward graphs: minutes on 2 cores
def test_a_compiled_denoiser_draws_the_same_tree_and_trains_without_recompiling(tmp_path) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    eager = _tree(TinySD3Adapter(num_steps=3, guidance_scale=1.0))
    adapter = TinySD3Adapter(num_steps=3, guidance_scale=1.0, compile=True)
    compiled = _tree(adapter)
    torch.testing.assert_close(compiled.leaf_latents, eager.leaf_latents, **ROUNDING)
    torch.testing.assert_close(compiled.edge_old_log_prob, eager.edge_old_log_prob, rtol=0, atol=1e-4)
    # parameter names (LoRA saving, checkpoints) are those of the plain module
    assert sorted(adapter.denoiser.state_dict()) == sorted(TinySD3Adapter(num_steps=3).denoiser.state_dict())

    graphs: list[int] = []  # compiled graphs after each iteration: the last ones compile nothing new

    class Count(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            graphs.append(counters["stats"]["unique_graphs"])

    model = TreeGRPOModule(adapter, reward=Brightness(), tree=SPEC, minibatches=2)
    trainer = L.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=tmp_path, callbacks=[Count()])  # fmt: skip
    trainer.fit(model, PromptDataModule("shapes", batch_size=2, val_size=0, val_fraction=0.0))
    assert len(graphs) == 4 and graphs[-1] == graphs[-2] == graphs[-3], graphs


def test_compile_is_refused_with_fsdp2_by_name() -> None:
    adapter = TinySD3Adapter(num_steps=3, compile=True)  # nn.Module.compile is lazy: nothing compiles here
    with pytest.raises(ValueError, match=r"compile true does not go with FSDP2"):
        adapter.shard(mesh=None)
