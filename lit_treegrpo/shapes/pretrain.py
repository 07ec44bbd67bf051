"""Pre-train the Shapes model by flow matching on procedural scenes, through Lightning.

Its command line keeps the main one's rules (:mod:`.pretrain_rules`): a bad option, file or folder ends in one
``error:`` line and exit status 2 (``LIT_TREEGRPO_DEBUG=1``: the traceback), every value checked before anything is
built. A fit owns ``--model.export_dir`` while it runs (the project's folder lock); the model is built in
``<export_dir>/.pretrain-tmp/new`` and moved in once complete, never over a file the fit did not write.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import sys
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from ..artifacts.run_folder import launch_rank
from ..cli.special_files import check_values
from ..cli.user_errors import OneLineParser, check_yaml_file, config_files
from ..core.rollout import rollout
from ..core.seeding import generator
from ..core.spec import TreeSpec
from . import world
from .model import (
    ShapesAdapter,
    ShapesModelConfig,
    build_components,
    encode_text,
    model_config_of,
)
from .pretrain_rules import (
    PretrainLock,
    check_export_dir,
    check_options,
    run_cli,
    take_export_dir,
    write_model_folder,
)
from .reward import ShapesReward

DEFAULT_MODEL = ShapesModelConfig()  # the shipped model's sizes


class SceneBatch(NamedTuple):
    images: Tensor  # [B, 3, H, W] in [-1, 1]
    prompts: list[str]  # captions, "" where dropped
    index: int  # global batch index k


class SceneStream(IterableDataset):
    """Infinite stream of rendered scene batches; batch ``k`` depends only on ``(seed, k)``."""

    def __init__(
        self,
        image_size: int,
        batch_size: int,
        seed: int,
        caption_dropout: float,
        size_word_prob: float,
        position_word_prob: float,
        start_index: int = 0,
    ) -> None:
        self.image_size = image_size
        self.batch_size = batch_size
        self.seed = seed
        self.caption_dropout = caption_dropout
        self.size_word_prob = size_word_prob
        self.position_word_prob = position_word_prob
        self.start_index = start_index

    def batch(self, k: int) -> SceneBatch:
        gen = generator(self.seed, k)
        scenes = world.sample_scenes(
            self.batch_size,
            self.image_size,
            gen,
            size_word_prob=self.size_word_prob,
            position_word_prob=self.position_word_prob,
        )
        drop = (torch.rand(self.batch_size, generator=gen) < self.caption_dropout).tolist()
        prompts = ["" if d else p for d, p in zip(drop, scenes.prompts)]
        return SceneBatch(world.render(scenes, self.image_size) * 2 - 1, prompts, k)

    def __iter__(self) -> Iterator[SceneBatch]:
        k = self.start_index
        while True:
            yield self.batch(k)
            k += 1


class ShapesDataModule(pl.LightningDataModule):
    """Procedural Shapes-world scenes for pre-training (nothing on disk).

    Args:
        batch_size: scenes per training step.
        seed: seed of the scene stream (batch k is a pure function of seed and k).
        caption_dropout: fraction of captions replaced by "" (unconditional, for CFG).
        size_word_prob: probability that a caption names a small / large size.
        position_word_prob: probability that a caption names a position the shape satisfies.
        image_size: side of the images in pixels (must match the model's).
    """

    def __init__(
        self,
        batch_size: int = 128,
        seed: int = 0,
        caption_dropout: float = 0.1,
        size_word_prob: float = 0.5,
        position_word_prob: float = 0.5,
        image_size: int = 16,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"--data.batch_size must be >= 1, got {batch_size}")
        for name, p in (
            ("caption_dropout", caption_dropout),
            ("size_word_prob", size_word_prob),
            ("position_word_prob", position_word_prob),
        ):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"--data.{name} must be in [0, 1], got {p}")
        self.batch_size = batch_size
        self.seed = seed
        self.caption_dropout = caption_dropout
        self.size_word_prob = size_word_prob
        self.position_word_prob = position_word_prob
        self.image_size = image_size

    def train_dataloader(self) -> DataLoader:
        start = self.trainer.global_step if self.trainer is not None else 0  # resumed runs continue
        stream = SceneStream(
            self.image_size,
            self.batch_size,
            self.seed,
            self.caption_dropout,
            self.size_word_prob,
            self.position_word_prob,
            start_index=start,
        )
        return DataLoader(stream, batch_size=None, collate_fn=lambda b: b, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        # one batch: the module samples its own fixed evaluation prompts and seeds
        return DataLoader([0], batch_size=None)


class ShapesPretrainModule(pl.LightningModule):
    """Flow-matching pre-training of the Shapes model (see the module docstring).

    Args:
        model: sizes of the transformer and text encoder.
        seed: seeds the initial weights and every noise draw.
        lr: AdamW peak learning rate (linear warm-up, then cosine decay to ``lr * final_lr_ratio``).
        weight_decay: AdamW weight decay.
        warmup_steps: steps of linear learning-rate warm-up.
        final_lr_ratio: learning rate at the end of training, relative to ``lr``.
        ema_decay: decay of the exponential moving average of the weights that is exported and
            evaluated (0 disables the average).
        grad_clip: clip the gradient norm to this value.
        eval_samples: validation images (the grammar's prompts in a fixed order, one seed each).
        eval_steps: denoising steps of the validation sampler.
        eval_guidance: CFG weight of the validation sampler (<= 1: none).
        export_dir: folder to write the final EMA weights to (a Shapes model folder); null: none.
    """

    def __init__(
        self,
        model: ShapesModelConfig = DEFAULT_MODEL,
        seed: int = 0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 100,
        final_lr_ratio: float = 0.1,
        ema_decay: float = 0.995,
        grad_clip: float = 1.0,
        eval_samples: int = 96,
        eval_steps: int = 10,
        eval_guidance: float = 1.0,
        export_dir: str | None = "runs/shapes_pretrain/model",
    ) -> None:
        super().__init__()
        if lr <= 0 or warmup_steps < 0 or not 0 <= final_lr_ratio <= 1 or grad_clip <= 0:
            raise ValueError(
                f"lr must be > 0, warmup_steps >= 0, final_lr_ratio in [0, 1] and grad_clip > 0; got "
                f"lr={lr}, warmup_steps={warmup_steps}, final_lr_ratio={final_lr_ratio}, grad_clip={grad_clip}"
            )
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        if eval_samples < 1 or eval_steps < 1:
            raise ValueError(f"eval_samples and eval_steps must be >= 1, got {eval_samples}, {eval_steps}")
        self.config = model
        self.seed = seed
        self.lr = lr
        self.weight_decay = weight_decay
        self.warmup_steps = warmup_steps
        self.final_lr_ratio = final_lr_ratio
        self.ema_decay = ema_decay
        self.grad_clip = grad_clip
        self.eval_samples = eval_samples
        self.eval_steps = eval_steps
        self.eval_guidance = eval_guidance
        self.export_dir = export_dir
        parts = build_components(model, seed)
        self.transformer = parts["transformer"]
        self.text_encoder = parts["text_encoder"]
        self.tokenizer = parts["tokenizer"]
        self.scheduler = parts["scheduler"]
        self.ema = [p.detach().clone() for p in self.parameters()]  # float32 shadows
        self._started = time.perf_counter()
        self.last_loss = math.nan
        self.last_eval: dict[str, float] = {}

    # ------------------------------------------------------------------------ training
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = max(self.trainer.max_steps, 1) if self.trainer.max_steps and self.trainer.max_steps > 0 else 10_000

        def factor(step: int) -> float:
            if step < self.warmup_steps:
                return (step + 1) / self.warmup_steps
            progress = min(1.0, (step - self.warmup_steps) / max(1, total - self.warmup_steps))
            return self.final_lr_ratio + (1 - self.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def flow_loss(self, images: Tensor, prompts: list[str], generator: torch.Generator) -> Tensor:
        """Rectified-flow velocity MSE of a batch ``images`` [B, 3, H, W] in [-1, 1]."""
        B = images.shape[0]
        sigma = torch.sigmoid(torch.randn(B, generator=generator)).to(images.device)  # [B] logit-normal
        eps = torch.randn(images.shape, generator=generator).to(images.device)  # [B, 3, H, W]
        s = sigma.view(B, 1, 1, 1)
        x_t = (1 - s) * images + s * eps
        cond = encode_text(self.text_encoder, self.tokenizer, prompts)
        v = self.transformer(
            hidden_states=x_t,
            timestep=sigma * 1000,
            encoder_hidden_states=cond["prompt_embeds"],
            pooled_projections=cond["pooled_prompt_embeds"],
            return_dict=False,
        )[0]
        return torch.nn.functional.mse_loss(v.float(), (eps - images).float())

    def training_step(self, batch: SceneBatch, batch_idx: int) -> Tensor:
        gen = generator(self.seed + 1, batch.index)
        loss = self.flow_loss(batch.images, batch.prompts, gen)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite pre-training loss {loss.item()} at step {self.global_step}")
        self.last_loss = float(loss.detach())
        self.log("loss", loss, prog_bar=True, batch_size=batch.images.shape[0])
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        self.clip_gradients(optimizer, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")

    @torch.no_grad()
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # warm the average up like a running mean early on, so it is not stuck at the random init
        decay = min(self.ema_decay, (1 + self.global_step) / (10 + self.global_step))
        for shadow, p in zip(self.ema, self.parameters()):
            shadow.lerp_(p.detach(), 1 - decay)

    # ------------------------------------------------------------------------ evaluation
    def ema_components(self) -> dict[str, Any]:
        """Copies of the components with the averaged weights."""
        parts = {"transformer": self.transformer, "text_encoder": self.text_encoder}
        copies = {name: copy.deepcopy(m) for name, m in parts.items()}
        names = [n for n, _ in self.named_parameters()]
        for name, shadow in zip(names, self.ema):
            owner, _, attr = name.partition(".")
            copies[owner].get_parameter(attr).data.copy_(shadow)
        return {**copies, "tokenizer": self.tokenizer, "scheduler": copy.deepcopy(self.scheduler)}

    def evaluation_prompts(self) -> list[str]:
        prompts = world.all_prompts()
        order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(12345)).tolist()
        return [prompts[i] for i in (order * math.ceil(self.eval_samples / len(prompts)))[: self.eval_samples]]

    @torch.no_grad()
    def evaluate(self, components: dict[str, Any] | None = None) -> dict[str, float]:
        """Reward and accuracies of deterministic samples of the (EMA) model on fixed prompts."""
        adapter = ShapesAdapter(
            components or self.ema_components(), num_steps=self.eval_steps, guidance_scale=self.eval_guidance, lora=None
        ).to(self.device)
        return evaluate_adapter(adapter, self.evaluation_prompts())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        metrics = self.evaluate()
        self.last_eval = metrics
        n = self.eval_samples
        self.log_dict({f"val/{k}": v for k, v in metrics.items() if k not in ("colour_acc", "shape_acc")}, batch_size=n)
        self.log_dict(
            {"val/colour_acc": metrics["colour_acc"], "val/shape_acc": metrics["shape_acc"]},
            prog_bar=True,
            batch_size=n,
        )

    # ------------------------------------------------------------------------ export
    def on_train_end(self) -> None:
        if self.export_dir is None or not self.trainer.is_global_zero:
            return
        parts = self.ema_components()
        metrics = self.evaluate(parts)
        metadata = {
            "made_by": "python -m lit_treegrpo.shapes.pretrain fit",
            "model": model_config_of(parts),
            "seed": self.seed,
            "data_seed": getattr(self.trainer.datamodule, "seed", None),
            "batch_size": getattr(self.trainer.datamodule, "batch_size", None),
            "steps": self.global_step,
            "lr": self.lr,
            "ema_decay": self.ema_decay,
            "final_loss": self.last_loss,
            "eval": metrics,
            "seconds": round(time.perf_counter() - self._started, 1),
            "torch": torch.__version__,
            "machine": platform.machine(),
        }
        kept = write_model_folder(self.export_dir, parts, metadata)
        rank_zero_info(
            f"Shapes model written to {self.export_dir}: colour accuracy {metrics['colour_acc']:.1%}, "
            f"shape accuracy {metrics['shape_acc']:.1%}, reward {metrics['reward']:.3f}"
            + (f"; kept {', '.join(kept)}, which it did not write" if kept else "")
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["ema"] = [t.clone() for t in self.ema]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.ema = [t.clone() for t in checkpoint["ema"]]


@torch.no_grad()
def evaluate_adapter(adapter: ShapesAdapter, prompts: list[str], seed: int = 0) -> dict[str, float]:
    """Deterministic samples, one per prompt (noise seeded by ``seed`` and the position), scored by
    :class:`ShapesReward`: mean reward and colour / shape / size / position accuracy."""
    images = sample(adapter, prompts, seed)
    a = ShapesReward().analyse(images, prompts)
    specs = [world.parse_prompt(p) for p in prompts]
    sized = torch.tensor([s.size is not None for s in specs])
    placed = torch.tensor([s.position is not None for s in specs])
    return {
        "reward": float(a.score.mean()),
        "colour_acc": float(a.colour_ok.float().mean()),
        "shape_acc": float(a.shape_ok.float().mean()),
        "size_acc": float((a.size_score[sized] > 0.99).float().mean()) if sized.any() else math.nan,
        "position_acc": float((a.position_score[placed] > 0.99).float().mean()) if placed.any() else math.nan,
    }


@torch.no_grad()
def sample(adapter: ShapesAdapter, prompts: list[str], seed: int = 0) -> Tensor:
    """Deterministic (ODE) samples [P, 3, H, W] in [0, 1], noise from one generator per position."""
    gens = [generator(seed, i) for i in range(len(prompts))]
    noise = torch.cat([adapter.initial_noise(1, g) for g in gens])  # [P, 3, H, W]
    cond = adapter.encode_prompts(prompts)
    tree = rollout(adapter.predict, adapter.step, TreeSpec(adapter.num_steps), cond, noise, max_batch=512)
    return adapter.decode(tree.leaf_latents)


class PretrainCLI(LightningCLI):
    """``python -m lit_treegrpo.shapes.pretrain fit --config configs/shapes_pretrain.yaml``, under the main command
    line's rules (:mod:`.pretrain_rules`)."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        from jsonargparse import set_parsing_settings

        from ..cli.first_checks import asks_for_help
        from ..common.config_yaml import use_checked_yaml

        # the options' descriptions come from the sources (seconds at every start): read them for --help only
        set_parsing_settings(docstring_parse_attribute_docstrings=asks_for_help(args))
        use_checked_yaml()  # no duplicate key, aliases bounded (docs/failure_modes.md, rules 2 and 4)
        self._lock: PretrainLock | None = None  # --model.export_dir, held by a fit while it runs
        try:
            super().__init__(
                ShapesPretrainModule,
                ShapesDataModule,
                args=args,
                run=run,
                parser_class=OneLineParser,  # a parse error in one line
                save_config_kwargs={"overwrite": True},
                parser_kwargs={"prog": "python -m lit_treegrpo.shapes.pretrain", "default_env": False},
            )
        finally:
            if self._lock is not None:
                self._lock.release()

    def init_parser(self, **kwargs: Any) -> Any:
        kwargs.setdefault("allow_abbrev", False)  # --trainer.max_step is a typo, not --trainer.max_steps
        return super().init_parser(**kwargs)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            files = config_files(argv)
            OneLineParser.config_sources = tuple((f, os.path.abspath(f)) for f in files)
            for path in files:
                check_yaml_file(path)  # a YAML error names its file
            check_values(argv, parser)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")  # every value, before the seed is set and anything is built
        check_options(self.config[subcommand] if subcommand else self.config, subcommand)

    def before_instantiate_classes(self) -> None:
        # the fit owns its model folder while it runs: an earlier model there is never written over
        export_dir = self.config["fit"]["model"].get("export_dir") if self.subcommand == "fit" else None
        if export_dir is not None:
            check_export_dir(export_dir)
            if launch_rank() == 0:  # the processes a DDP launcher starts beside rank 0 leave it to rank 0
                self._lock = take_export_dir(export_dir)


def main(args: list[str] | None = None) -> None:
    """Run the pre-training's command line: a user error in one ``error:`` line and exit status 2."""
    run_cli(lambda: PretrainCLI(args=args))


if __name__ == "__main__":
    main()
