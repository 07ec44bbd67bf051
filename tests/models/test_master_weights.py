"""Full fine-tuning in bfloat16 keeps float32 master weights: bf16 weights round away an AdamW step
of lr 1e-5 on most of them (a step smaller than half their spacing, ~0.4% of a weight). The
denoiser computes in bf16 under autocast over its float32 weights (FSDP2: gathered in bf16, reduced
and stepped in float32)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml

from lit_treegrpo.models.tiny import TinySD3Adapter

LR = 1e-5


def _one_adamw_step(adapter, x, cond, weights) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(weights before, after, gradients) of one AdamW step on ``sum(prediction * weights)``."""
    params = adapter.trainable_parameters()
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    (adapter.predict(x, 1, cond).float() * weights).sum().backward()
    grads = [p.grad.detach().clone() for p in params]
    optimizer.step()
    return before, [p.detach().clone() for p in params], grads


def _fraction_changed(before, after) -> float:
    return sum(int((a != b).sum()) for a, b in zip(after, before)) / sum(b.numel() for b in before)


def _holdable(before, grads) -> list[torch.Tensor]:
    """Per tensor, where AdamW's first step ``lr g / (|g| + eps)`` is at least half a float32 spacing of the weight:
    the elements float32 can move (a gradient far below eps gives a step that rounds away in any float32 model;
    how many such gradients a CPU's kernels produce differs between machines)."""
    out = []
    for b, g in zip(before, grads):
        spacing = (torch.nextafter(b, torch.full_like(b, torch.inf)) - b).abs()
        out.append((LR * g.abs() / (g.abs() + 1e-8)) >= spacing / 2)
    return out


@pytest.fixture(scope="module")
def steps():
    """One AdamW step of the tiny SD3.5 fully fine-tuned three ways, from the same (bf16-exact)
    weights, on the same input: bf16 compute over float32 masters, float32, and bf16 weights."""
    master = TinySD3Adapter(num_steps=3, guidance_scale=4.5, lora=None, torch_dtype="bfloat16")
    full = TinySD3Adapter(num_steps=3, guidance_scale=4.5, lora=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pure = TinySD3Adapter(num_steps=3, guidance_scale=4.5, lora=None, torch_dtype="bfloat16", master_weights=False)
    for other in (full, pure):
        other.denoiser.load_state_dict(master.denoiser.state_dict())
    cond = full.encode_prompts(["a red circle"])
    x = full.initial_noise(1, torch.Generator().manual_seed(0))
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    out = {name: _one_adamw_step(a, x, cond, weights) for name, a in (("master", master), ("float32", full), ("bf16", pure))}  # fmt: skip
    return out, master, pure, [str(w.message) for w in caught], (x, cond)


def test_bf16_full_fine_tuning_computes_in_bf16_over_float32_master_weights(steps) -> None:
    _, master, pure, _, (x, cond) = steps
    assert master.dtype == torch.bfloat16  # the latents' and the computation's dtype
    assert {p.dtype for p in master.trainable_parameters()} == {torch.float32}
    assert master.predict(x, 1, cond).dtype == torch.bfloat16  # autocast reached the denoiser
    assert {p.dtype for p in pure.trainable_parameters()} == {torch.bfloat16}
    assert next(master.text_encoder.parameters()).dtype == torch.bfloat16  # only the trained weights are float32


def test_one_adamw_step_at_lr_1e5_changes_every_weight_as_the_float32_step_does(steps) -> None:
    out, *_ = steps
    before, after, grads = out["master"]
    # every element whose step float32 can hold, of every trainable tensor (all but a few in 10^5 elsewhere)
    for (b, a, g), version in [(out["master"], "master"), (out["float32"], "float32")]:
        holdable = _holdable(b, g)
        assert all(bool((x != y)[h].all()) for x, y, h in zip(a, b, holdable)), version
        assert sum(int(h.sum()) for h in holdable) / sum(x.numel() for x in b) > 0.999, version
    # the step is AdamW's first, lr * g / (|g| + eps) (both moments' bias corrections cancel), on
    # the master's own gradient, to float32 rounding of the weights (<= 1 unit in 2^24 of |w| <= 1)
    for b, a, g in zip(before, after, grads):
        torch.testing.assert_close(a - b, -LR * g / (g.abs() + 1e-8), rtol=0, atol=1.2e-7)
    # and that gradient is float32's to bf16's tolerance (computed in bf16: measured 2.3% apart)
    g_master = torch.cat([g.flatten() for g in grads])
    g_float32 = torch.cat([g.flatten() for g in out["float32"][2]])
    assert float((g_master - g_float32).norm() / g_float32.norm()) < 0.05
    # so the update agrees in sign with float32's nearly everywhere (measured 99.2%; it differs only
    # where a gradient is within bf16's rounding of zero)
    steps_master = torch.cat([(a - b).flatten() for a, b in zip(after, before)])
    steps_float32 = torch.cat([(a - b).flatten() for b, a in zip(*out["float32"][:2])])
    assert float((steps_master.sign() == steps_float32.sign()).float().mean()) > 0.98


def test_pure_bf16_weights_lose_most_of_the_step_and_are_warned_about(steps) -> None:
    out, _, _, caught, _ = steps
    assert _fraction_changed(*out["bf16"][:2]) < 0.1  # measured 3.1% on the tiny model
    messages = [m for m in caught if m.startswith("master_weights false")]
    assert messages == [
        "master_weights false: the denoiser fine-tunes its bfloat16 weights themselves, which round away any "
        "update below ~0.39% of a weight (AdamW at lr 1e-5 leaves most weights unchanged); set "
        "--model.adapter.init_args.master_weights true for float32 master weights"
    ]


def test_lora_and_float32_runs_are_left_as_they_were() -> None:
    lora = TinySD3Adapter(num_steps=2, torch_dtype="bfloat16")  # LoRA: float32 LoRA weights, bf16 base
    assert lora.dtype == torch.bfloat16 and lora._compute_dtype is None
    assert all(p.dtype == torch.float32 for p in lora.trainable_parameters())
    assert all(p.dtype == torch.bfloat16 for n, p in lora.denoiser.named_parameters() if "lora_" not in n)
    full = TinySD3Adapter(num_steps=2, lora=None)
    assert full.dtype == torch.float32 and full._compute_dtype is None


def test_fsdp2_gathers_in_bf16_and_steps_the_float32_shards(tmp_path: Path, steps) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    *_, (x, cond) = steps
    adapter = TinySD3Adapter(num_steps=3, guidance_scale=4.5, lora=None, torch_dtype="bfloat16")
    unsharded = adapter.predict(x, 1, cond)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        adapter.shard(init_device_mesh("cpu", (1,)))
        params = adapter.trainable_parameters()
        assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)
        before = [p.detach().full_tensor().clone() for p in params]
        prediction = adapter.predict(x, 1, cond)
        assert prediction.dtype == torch.bfloat16
        # the same model computed from bf16-gathered weights instead of autocast's casts: bf16 apart
        torch.testing.assert_close(prediction.float(), unsharded.float(), rtol=0, atol=0.1)
        (prediction.float() * torch.ones_like(prediction, dtype=torch.float32)).sum().backward()
        assert {p.grad.dtype for p in params} == {torch.float32}  # reduced in float32
        torch.optim.AdamW(params, lr=LR, weight_decay=0.0).step()
        for p, b in zip(params, before):  # every weight whose gradient is not exactly 0 moved
            moved = p.detach().full_tensor() != b
            assert bool(moved[p.grad.full_tensor() != 0].all())
    finally:
        dist.destroy_process_group()


def test_every_shipped_config_that_fine_tunes_fully_in_low_precision_keeps_master_weights() -> None:
    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    full = []
    for path in configs:
        args = (((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("adapter") or {}).get(
            "init_args"
        ) or {}
        if "lora" in args and args["lora"] is None and args.get("torch_dtype", "float32") != "float32":
            assert args.get("master_weights", True) is True, path.name
            full.append(path.name)
    assert full == ["flux.yaml", "sd35_fsdp.yaml"]
