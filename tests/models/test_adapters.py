"""Adapters against the diffusers pipelines themselves, on tiny seeded models (no downloads)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout
from lit_treegrpo.models import LoraSettings, SD3Adapter, SD15Adapter
from lit_treegrpo.models.text import check_tokenizer
from lit_treegrpo.models.tiny import TinySD3Adapter, TinySD15Adapter, tiny_sd3_pipeline, tiny_sd15_pipeline
from tests.models.helpers import assert_bfloat16_tree_is_finite

PROMPTS = ["a red triangle", "two blue circles on grass"]
T = 4


@dataclass
class Family:
    make_pipe: Callable[..., Any]
    adapter: type
    adapter_kwargs: dict
    pipe_kwargs: dict  # what the pipeline call needs to run the same deterministic sampler


FAMILIES = {
    "sd15": Family(tiny_sd15_pipeline, SD15Adapter, dict(guidance_scale=5.0), dict(eta=0.0)),
    "sd15_vpred": Family(
        lambda seed=0: tiny_sd15_pipeline(seed, prediction_type="v_prediction"),
        SD15Adapter,
        dict(guidance_scale=3.0),
        dict(eta=0.0),
    ),
    "sd3": Family(tiny_sd3_pipeline, SD3Adapter, dict(guidance_scale=4.5), dict(max_sequence_length=128)),
    "sd3_no_t5": Family(
        lambda seed=0: tiny_sd3_pipeline(seed, with_t5=False),
        SD3Adapter,
        dict(guidance_scale=4.5, use_t5=False),
        dict(max_sequence_length=128),
    ),
}


def make(name: str, seed: int = 0, **overrides):
    fam = FAMILIES[name]
    pipe = fam.make_pipe(seed)
    pipe.set_progress_bar_config(disable=True)
    adapter = fam.adapter(pipe, num_steps=T, **{**fam.adapter_kwargs, **overrides})
    return adapter, pipe


def deterministic_leaves(adapter, noise: torch.Tensor) -> torch.Tensor:
    cond = adapter.encode_prompts(PROMPTS)
    return rollout(adapter.predict, adapter.step, TreeSpec(T), cond, noise).leaf_latents


def pipeline_latents(name: str, pipe, adapter, noise: torch.Tensor, output_type: str = "latent"):
    return pipe(
        prompt=PROMPTS,
        latents=noise.clone(),
        num_inference_steps=T,
        guidance_scale=adapter.guidance_scale,
        output_type=output_type,
        **FAMILIES[name].pipe_kwargs,
    ).images


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_deterministic_rollout_equals_the_pipeline(name: str) -> None:
    adapter, pipe = make(name)
    noise = adapter.initial_noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ours = deterministic_leaves(adapter, noise)
    theirs = pipeline_latents(name, pipe, adapter, noise)
    assert ours.shape == theirs.shape == (2, 4, 16, 16)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    # and the decoded images equal the pipeline's own post-processed [0, 1] output
    images = adapter.decode(ours)
    assert images.dtype == torch.float32 and images.shape == (2, 3, 32, 32)
    assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0
    torch.testing.assert_close(images, pipeline_latents(name, pipe, adapter, noise, "pt"), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_guidance_is_one_batched_forward(name: str) -> None:
    adapter, _ = make(name)
    hook_sizes: list[int] = []

    def record(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        hook_sizes.append(x.shape[0])

    adapter.denoiser.register_forward_pre_hook(record, with_kwargs=True)
    cond = adapter.encode_prompts(PROMPTS)
    x = adapter.initial_noise(2)
    adapter.predict(x, 0, cond)
    assert hook_sizes == [4]  # [uncond; cond] in one call
    adapter.guidance_scale = 1.0
    adapter.predict(x, 0, adapter.encode_prompts(PROMPTS))
    assert hook_sizes == [4, 2]


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_loading_a_saved_pipeline_reproduces_it(name: str, tmp_path) -> None:
    FAMILIES[name].make_pipe(0).save_pretrained(tmp_path)  # the adapter adds LoRA to its own pipe
    adapter, _ = make(name)
    loaded = FAMILIES[name].adapter(str(tmp_path), num_steps=T, **FAMILIES[name].adapter_kwargs)
    assert len(loaded.pipeline.tokenizer) == 514
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        deterministic_leaves(loaded, noise), deterministic_leaves(adapter, noise), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("adapter_cls", [SD15Adapter, SD3Adapter])
def test_missing_weights_give_one_line_errors(adapter_cls, tmp_path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no such file or folder") as err:
        adapter_cls(str(missing))
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE") as err:
        adapter_cls("nobody/not-a-cached-model")
    assert "nobody/not-a-cached-model" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks this component"):
        adapter_cls(str(tmp_path / "empty"))


def test_empty_tokenizer_is_refused() -> None:
    class Empty:
        def __len__(self) -> int:
            return 0

    with pytest.raises(ValueError, match="empty vocabulary"):
        check_tokenizer(Empty(), "some/tokenizer")


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_recomputed_log_probs_have_ratio_one_in_float32(name: str) -> None:
    adapter, _ = make(name)
    spec = TreeSpec(T, branch_steps=(0, 1), branching=2, sde_steps=(2,))
    cond = adapter.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(0)
    tree = rollout(adapter.predict, adapter.step, spec, cond, adapter.initial_noise(2, gen), generator=gen)
    assert tree.num_edges == 2 * spec.num_edges()
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
    ratio = torch.exp(out.step.log_prob - tree.edge_old_log_prob)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    out.step.log_prob.sum().backward()
    grads = [p.grad for p in adapter.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_bf16_rollout_and_recompute_are_finite(name: str) -> None:
    fam = FAMILIES[name]
    pipe = fam.make_pipe(0)
    adapter = fam.adapter(pipe, num_steps=T, **fam.adapter_kwargs, torch_dtype="bfloat16")  # casts the built pipeline
    assert adapter.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in adapter.trainable_parameters())  # LoRA masters
    assert_bfloat16_tree_is_finite(adapter, PROMPTS, T)


def train_one_step(adapter, lr: float = 1e-2) -> None:
    """One real policy-gradient step on the adapter's trainable parameters."""
    spec = TreeSpec(T, branch_steps=(0, 1), branching=2)
    cond = adapter.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(0)
    tree = rollout(adapter.predict, adapter.step, spec, cond, adapter.initial_noise(2, gen), generator=gen)
    advantages = torch.linspace(-1, 1, tree.num_edges)
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
    loss = ClippedPolicyLoss(clip_range=10.0)(out.step.log_prob, tree.edge_old_log_prob, advantages).loss
    optimizer = torch.optim.SGD(adapter.trainable_parameters(), lr=lr)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_lora_trains_only_lora_weights(name: str) -> None:
    adapter, _ = make(name)
    trainable = {n for n, p in adapter.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {k: v.clone() for k, v in adapter.state_dict().items()}
    train_one_step(adapter)
    after = adapter.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    # the B matrices started at zero and moved: the policy changed
    assert any("lora_B" in k for k in changed)


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_exported_lora_reproduces_the_adapter_in_a_plain_pipeline(name: str, tmp_path) -> None:
    adapter, _ = make(name, lora=LoraSettings(rank=4, alpha=8.0))
    gen = torch.Generator().manual_seed(0)
    for param_name, p in adapter.named_parameters():
        if "lora_B" in param_name:  # B starts at zero: give every adapted layer a visible effect
            p.data = 0.3 * torch.randn(p.shape, generator=gen)
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    trained = deterministic_leaves(adapter, noise)
    adapter.save_lora(tmp_path)
    fresh = FAMILIES[name].make_pipe(0)
    fresh.set_progress_bar_config(disable=True)
    base = pipeline_latents(name, fresh, adapter, noise)
    fresh.load_lora_weights(str(tmp_path))
    torch.testing.assert_close(pipeline_latents(name, fresh, adapter, noise), trained, atol=1e-4, rtol=0)
    assert (trained - base).abs().max() > 1e-2  # the LoRA matters
    with adapter.reference():  # adapters disabled: the base model
        torch.testing.assert_close(deterministic_leaves(adapter, noise), base, atol=1e-4, rtol=0)
    torch.testing.assert_close(deterministic_leaves(adapter, noise), trained, atol=0, rtol=0)


def test_full_finetune_trains_the_whole_denoiser() -> None:
    adapter, _ = make("sd15", lora=None)
    denoiser = {id(p) for p in adapter.denoiser.parameters()}
    assert {id(p) for p in adapter.trainable_parameters()} == denoiser
    with (
        pytest.raises(
            ValueError,
            match=r"^loss.kl_beta > 0 needs the adapter's lora .*; set adapter.init_args.lora or loss.kl_beta 0$",
        ),
        adapter.reference(),
    ):
        pass
    with pytest.raises(ValueError, match="save_lora needs LoRA"):
        adapter.save_lora("unused")


def test_modules_stay_in_eval_mode() -> None:
    adapter, _ = make("sd3")
    adapter.train()
    assert not any(m.training for m in adapter.modules())


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (TinySD15Adapter, dict(eta=0.0), "eta must be > 0"),
        (TinySD15Adapter, dict(resolution=33), "multiple of 2"),
        (TinySD15Adapter, dict(num_steps=0), "num_steps"),
        (TinySD15Adapter, dict(guidance_scale=-1.0), "guidance_scale"),
        (TinySD15Adapter, dict(decode_batch_size=0), "decode_batch_size"),
        (
            TinySD15Adapter,
            dict(lora=LoraSettings(target_modules=("to_q", "nothing_here"))),
            r"lora.target_modules \[.nothing_here.\] match no module",
        ),
        (TinySD3Adapter, dict(dynamics="ode"), "dynamics"),
        (TinySD3Adapter, dict(noise_level=0.0), "noise_level"),
        (TinySD3Adapter, dict(resolution=34), "multiple of 4"),
    ],
)
def test_bad_options_are_named(factory, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)


def test_bad_dtype_and_step_index() -> None:
    with pytest.raises(ValueError, match="torch_dtype must be one of"):
        SD15Adapter("/nowhere", torch_dtype="fp8")
    adapter, _ = make("sd15")
    with pytest.raises(ValueError, match="step_index must be in 0..3"):
        adapter.predict(adapter.initial_noise(1), T, adapter.encode_prompts(PROMPTS[:1]))
    # a [B] tensor (training) is checked on the device, without waiting for it: on the CPU at once
    with pytest.raises(RuntimeError, match="step_index must be in 0..3"):
        adapter.predict(adapter.initial_noise(1), torch.tensor([T]), adapter.encode_prompts(PROMPTS[:1]))


def test_lora_settings_validation() -> None:
    for kwargs, message in [
        (dict(rank=0), "lora.rank"),
        (dict(alpha=0.0), "lora.alpha"),
        (dict(init="zeros"), "lora.init"),
        (dict(dropout=1.0), "lora.dropout"),
    ]:
        with pytest.raises(ValueError, match=message):
            LoraSettings(**kwargs)


def test_initial_noise_is_reproducible_and_shaped() -> None:
    adapter, _ = make("sd3")
    a = adapter.initial_noise(3, torch.Generator().manual_seed(0))
    b = adapter.initial_noise(3, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == (3, 4, 16, 16) and a.dtype == adapter.dtype
    assert copy.deepcopy(adapter) is not adapter  # adapters can be copied (EMA, reference models)


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_gradient_checkpointing_gives_the_same_gradients(name: str) -> None:
    grads = []
    for checkpointing in (False, True):
        adapter, _ = make(name, gradient_checkpointing=checkpointing)
        assert adapter.denoiser.is_gradient_checkpointing == checkpointing
        cond = adapter.encode_prompts(PROMPTS)
        x = adapter.initial_noise(2, torch.Generator().manual_seed(0))
        prev = adapter.initial_noise(2, torch.Generator().manual_seed(1))
        out = adapter.step(adapter.predict(x, 1, cond), x, 1, stochastic=True, prev_sample=prev)
        out.log_prob.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in adapter.trainable_parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- long prompts
LONG = "a very detailed photograph of " + "a small red fox " * 8  # > 77 byte-level CLIP tokens


@pytest.mark.parametrize("name", ["sd15", "sd3"])
def test_prompts_over_the_clip_limit_are_warned_once_with_the_count(name: str, caplog) -> None:
    import warnings

    from lit_treegrpo.models.text import PromptTruncationWarning

    adapter, _ = make(name, max_sequence_length=512) if name == "sd3" else make(name)
    prompts = ["a red fox"] * 5 + [LONG] * 3
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        adapter.encode_prompts(prompts)
        adapter.encode_prompts(prompts)  # the same again: no second warning
    messages = [str(w.message) for w in seen if issubclass(w.category, PromptTruncationWarning)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("3 of 8 prompts exceed the CLIP text encoder's 77 tokens and were truncated")
    assert adapter.truncation.truncated == {"CLIP": 6, **({"T5": 0} if name == "sd3" else {})}
    assert adapter.truncation.seen["CLIP"] == 16
    # the libraries' own per-call lines are replaced by the one warning
    assert not [r for r in caplog.records if "truncated" in r.getMessage() or "Token indices" in r.getMessage()]


def test_prompts_over_t5_max_sequence_length_are_warned_once_per_encoder() -> None:
    import warnings

    from lit_treegrpo.models.text import PromptTruncationWarning

    adapter, _ = make("sd3", max_sequence_length=16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        adapter.encode_prompts(["a red fox", "a blue bird in a green tree"])  # 10 and 28 T5 tokens
        adapter.encode_prompts([LONG])
    messages = [str(w.message) for w in seen if issubclass(w.category, PromptTruncationWarning)]
    assert len(messages) == 2, messages  # T5 on the first call, CLIP on the second
    assert messages[0].startswith("1 of 2 prompts exceed the T5 text encoder's 16 tokens")
    assert messages[1].startswith("1 of 1 prompts exceed the CLIP text encoder's 77 tokens")
    assert adapter.truncation.truncated == {"CLIP": 1, "T5": 2}


def test_truncation_warner_takes_any_tokenizer_callable() -> None:
    import warnings

    from lit_treegrpo.models.text import PromptTruncationWarning, TruncationWarner

    warner = TruncationWarner()
    words = lambda prompts: [p.split() for p in prompts]  # noqa: E731  one "token" per word
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert warner(words, ["a b c", "a b"], 2, "toy") == 1
        assert warner(words, ["a b c d"], 2, "toy") == 1
    messages = [str(w.message) for w in seen if issubclass(w.category, PromptTruncationWarning)]
    assert len(messages) == 1 and messages[0].startswith("1 of 2 prompts exceed the toy text encoder's 2 tokens")
    assert warner.truncated == {"toy": 2} and warner.seen == {"toy": 3}
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        warner(words, ["a"], 0, "toy")


def test_the_adapter_declares_what_other_code_reads() -> None:
    # the module, the memory guard and the export read these plainly: each has a declared default
    import ast
    from pathlib import Path

    from lit_treegrpo.models.base import DiffusionAdapter

    for name in ("pipeline", "lora_layers_arg", "source", "makes_video", "shard_blocks"):
        assert name in vars(DiffusionAdapter), name
    adapter = TinySD3Adapter(num_steps=2)
    assert (adapter.source, adapter.makes_video, adapter.lora_layers_arg) == (None, False, "transformer")
    assert adapter.pipeline is not None and adapter.gradient_checkpointing is False and adapter.lora is not None
    # and nothing probes an adapter with getattr / hasattr (third-party objects may be probed)
    repo = Path(__file__).resolve().parents[2]
    probes = []
    for path in [*(repo / "lit_treegrpo").rglob("*.py"), *(repo / "callbacks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and node.args:
                target = ast.unparse(node.args[0])
                if target.split(".")[-1] == "adapter":
                    probes.append(f"{path.relative_to(repo)}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, probes
