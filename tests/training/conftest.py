"""Fixtures of the training tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def tiny():
    """The tiny SD3 adapter with and without guidance and gradient checkpointing (keyed by
    ``(guidance_scale, gradient_checkpointing)``), each one's conditioning of one prompt, and a
    root noise: what the memory probe and the training guard measure."""
    from lit_treegrpo.models.tiny import TinySD3Adapter

    adapters = {
        (cfg, ckpt): TinySD3Adapter(num_steps=3, guidance_scale=cfg, gradient_checkpointing=ckpt)
        for cfg in (1.0, 4.5)
        for ckpt in (False, True)
    }
    conds = {key: adapter.encode_prompts(["a red circle"]) for key, adapter in adapters.items()}
    noise = adapters[1.0, False].initial_noise(1, torch.Generator().manual_seed(0))
    return adapters, conds, noise
