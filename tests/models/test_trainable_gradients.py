"""No trainable parameter that can never get a gradient: after one training step (LoRA's A gets none
while its B is zero), every trainable tensor of every tiny family has a non-zero gradient, with the
default LoRA and fully fine-tuned. SD3's and Qwen-Image's last block drops the text stream, so its
text query (and Qwen-Image's text output and MLP) get no LoRA and, fully fine-tuned, stay frozen;
without that exclusion exactly those tensors get a zero gradient forever."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout, tree_advantages
from lit_treegrpo.models.base import DiffusionAdapter
from lit_treegrpo.models.tiny import TinyFluxAdapter, TinySD3Adapter, TinySD15Adapter
from lit_treegrpo.models.tiny_qwen import TinyQwenImageAdapter
from lit_treegrpo.models.tiny_wan import TinyWan22Adapter, TinyWanAdapter

FAMILIES = {
    "sd15": lambda **kw: TinySD15Adapter(num_steps=3, **kw),
    "sd35": lambda **kw: TinySD3Adapter(num_steps=3, **kw),
    "sd3": lambda **kw: TinySD3Adapter(num_steps=3, sd35=False, **kw),
    "flux": lambda **kw: TinyFluxAdapter(num_steps=3, **kw),
    "qwen_image": lambda **kw: TinyQwenImageAdapter(num_steps=3, **kw),
    "wan21": lambda **kw: TinyWanAdapter(num_steps=3, num_frames=5, **kw),
    "wan22_ti2v": lambda **kw: TinyWan22Adapter(kind="ti2v", num_steps=3, num_frames=5, **kw),
    "wan22_a14b": lambda **kw: TinyWan22Adapter(num_steps=4, num_frames=5, **kw),
}


def zero_gradient_tensors(adapter: DiffusionAdapter) -> list[str]:
    """The trainable tensors whose gradient is exactly zero (or absent) after one AdamW step, on a
    tree that trains every stochastic step (A14B: branches on both sides of its expert boundary)."""
    if isinstance(adapter, TinyWan22Adapter) and adapter.denoiser_2 is not None:
        spec = TreeSpec(4, branch_steps=(1, 2), branching=2)  # steps 0-1: high-noise expert, 2-3: low-noise
    else:
        spec = TreeSpec(3, branch_steps=(0, 1), branching=2)
    prompts = ["a red circle", "two blue squares"]
    cond = adapter.encode_prompts(prompts)
    gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    tree = rollout(adapter.predict, adapter.step, spec, cond, torch.cat([adapter.initial_noise(1, g) for g in gens]), generator=gens)  # fmt: skip
    advantages = tree_advantages(torch.linspace(0, 1, tree.num_leaves), tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)  # fmt: skip
    edges = torch.arange(tree.num_edges)
    params = dict((n, p) for n, p in adapter.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(params.values(), lr=1e-3)
    loss = ClippedPolicyLoss(clip_range=10.0)  # no clipping: the second step's ratios are no longer 1
    for step in range(2):
        optimizer.zero_grad()
        new = recompute_log_probs(adapter.predict, adapter.step, tree, edges, cond)
        loss(new.step.log_prob, tree.edge_old_log_prob[edges], advantages[edges], group=new.group).loss.backward()
        if step == 0:
            optimizer.step()
    return [n for n, p in params.items() if p.grad is None or not bool(p.grad.ne(0).any())]


@pytest.mark.parametrize("lora", ["default", "full"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_trainable_tensor_gets_a_gradient_after_one_step(family: str, lora: str) -> None:
    adapter = FAMILIES[family](**({} if lora == "default" else {"lora": None}))
    assert zero_gradient_tensors(adapter) == []


LAST = "denoiser.transformer_blocks.1."


def _module_of(name: str) -> str:
    """The module a trainable tensor belongs to, below the last block (a LoRA's: the layer it adapts)."""
    name = name.removeprefix(LAST)
    return name.split(".lora_")[0] if ".lora_" in name else name.rsplit(".", 1)[0]


@pytest.mark.parametrize(
    ("family", "lora", "expected"),
    [
        ("sd35", "default", ["attn.add_q_proj"]),
        ("sd35", "full", ["attn.add_q_proj", "attn.norm_added_q"]),
        ("sd3", "default", ["attn.add_q_proj"]),
        ("sd3", "full", ["attn.add_q_proj"]),  # no QK-norm
        ("qwen_image", "default", ["attn.add_q_proj", "attn.to_add_out"]),
        (
            "qwen_image",
            "full",
            ["attn.add_q_proj", "attn.norm_added_q", "attn.to_add_out", "txt_mlp.net.0.proj", "txt_mlp.net.2"],
        ),  # fmt: skip
    ],
)
def test_the_excluded_modules_are_exactly_those_that_get_no_gradient(
    family: str, lora: str, expected: list[str], monkeypatch
) -> None:
    adapter = FAMILIES[family](**({} if lora == "default" else {"lora": None}))
    excluded = adapter.unused_modules(adapter.denoiser)
    monkeypatch.setattr(type(adapter), "unused_modules", DiffusionAdapter.unused_modules)  # attach / train them all
    dead = zero_gradient_tensors(FAMILIES[family](**({} if lora == "default" else {"lora": None})))
    assert all(n.startswith(LAST) for n in dead)  # the last block's
    assert sorted({_module_of(n) for n in dead}) == expected
    # and the exclusion names those modules (the MLP as a whole)
    assert {LAST.removeprefix("denoiser.") + m for m in expected} <= {
        name
        for name, _ in adapter.denoiser.named_modules()
        if any(name == e or name.startswith(e + ".") for e in excluded)
    }
