"""TreeGRPO against DanceGRPO, Flow-GRPO, MixGRPO and BranchGRPO, side by side in one run.

Every method is a configuration of the one :class:`~lit_treegrpo.module.TreeGRPOModule` (tree,
advantage estimator, SDE, pruning, optimizer steps per rollout, KL), trained on the Shapes world from
the same shipped weights and the same prompts, 27 leaves per prompt for all of them (flat methods:
G = 27 chains). Each method follows its official code (the file is named in ``methods()``), with
one change applied to all alike: the last two denoising steps are deterministic (``ode_tail=2``).
On this pixel-space model the step into sigma 0.001 adds noise that nothing removes
(``benchmarks/step_noise.py``: reward 0.63 -> 0.13-0.20); the latent-space originals either never
train that step and decode its x0 prediction (DanceGRPO), or keep their window off it (MixGRPO,
TreeGRPO).

Each method runs at its own best learning rate: ``--sweep`` trains every method at each rate of
its grid on the sweep seeds (100, 101) and writes ``sweep.json`` / ``sweep.md`` with the rate of the
best mean final held-out reward; the comparison then reads those rates (``--lrs``) and runs on
seeds 0, 1, 2, so nothing is chosen on the reported numbers. Each run lasts until it has spent the
sampling-NFE budget and the wall-clock budget. Finished runs are cached under ``--out``/runs, so an
interrupted benchmark resumes, and several processes (``--seed-list``) can share the work.

Recorded per method (results.json, one object per method; means and spreads over seeds):

- seconds per iteration, split into rollout / reward / advantages+pruning / training;
- NFE per iteration: sampling (rollout) and training (forwards recomputing log-probs);
- the held-out reward curve (deterministic samples of the held-out prompts, never trained on)
  against sampling NFE, total NFE, optimizer steps and wall-clock (evaluation time excluded);
- the within-prompt diversity of those samples (mean pairwise RMS distance over seeds);
- NFE and wall-clock to the target reward, which the baselines set: the best flat baseline's mean
  final held-out reward (``speedup_vs_best_flat``), and DanceGRPO's own (``speedup_vs_dancegrpo``);
- tree bookkeeping: the share of iteration time spent in the rollout engine outside model calls,
  in the advantage backup and in pruning.

Outputs in ``--out``: ``results.json``, ``reward_vs_nfe.png``, ``reward_vs_wallclock.png``,
``iteration_time.png``; the Markdown table is printed last, formatted from the JSON's numbers.

    python benchmarks/compare_methods.py --quick --out runs/bench                   # < 10 min, 2 cores
    python benchmarks/compare_methods.py --sweep --out benchmarks/results/shapes_cpu  # the lr sweep
    python benchmarks/compare_methods.py --out benchmarks/results/shapes_cpu         # seeds 0, 1, 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable
from unittest import mock
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lit_treegrpo.callbacks import PruningSchedule, SampleDiversity
from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec
from lit_treegrpo.core.spec import WindowSchedule
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.shapes import ShapesAdapter
from lit_treegrpo import module as module_code
from lit_treegrpo.module import TreeGRPOModule
from lit_treegrpo.rewards import ShapesReward
from lit_treegrpo.settings import AdvantageSettings

T = 10  # denoising steps of every method (the papers' NFE = 10 setting)
LEAVES = 27  # leaves per prompt of every method
ODE_TAIL = 2  # steps 8 (sigma 0.112 -> 0.001) and 9 stay deterministic: see the module docstring
ALL_SDE = tuple(range(T - ODE_TAIL))  # every step that may be stochastic: 0 .. 7
SWEEP_SEEDS = (100, 101)  # learning rates are chosen on these, never on the reported seeds
REPORT_SEEDS = (0, 1, 2)
FLAT_GRID = (1e-4, 3e-4, 1e-3)  # learning-rate grids (AdamW on the LoRA r16), each spanning 10x
EDGEWISE_GRID = (1e-5, 3e-5, 1e-4)  # BranchGRPO steps every 12 edges: tens of steps per rollout
# a first sweep on seed 100 chose the top rate of the grids above for Flow-GRPO, TreeGRPO and
# BranchGRPO; their grids move one step up (the lowest rate, clearly worse there, is dropped). The
# pruned and Mix BranchGRPO variants keep EDGEWISE_GRID: their 3e-4 runs are not done yet
HIGHER_GRID = (3e-4, 1e-3, 3e-3)
HIGHER_EDGEWISE_GRID = (3e-5, 1e-4, 3e-4)


@dataclass(frozen=True)
class Method:
    """One method as a configuration of TreeGRPOModule."""

    name: str
    description: str
    tree: TreeSpec
    advantage: AdvantageSettings = AdvantageSettings()
    dynamics: str = "flow_sde"
    noise_level: float = 0.7
    clip_range: float = 1e-4
    schedule: dict[str, Any] | None = None  # PruningSchedule options
    flat: bool = False
    minibatches: int = 1  # optimizer steps per rollout
    edges_per_update: int | None = None  # instead: one optimizer step per this many kept edges
    kl_beta: float = 0.0
    kl_form: str = "exact"
    lr_grid: tuple[float, ...] = FLAT_GRID
    follows: str = ""  # the official code each setting comes from


def methods(window_every: int) -> dict[str, Method]:
    """The compared methods, all with 27 leaves per prompt over 10 steps, each as its official code
    runs it (``follows``), scaled from the papers' 16-25 steps to 10 where a setting counts steps."""
    tree_window = WindowSchedule(kind="geometric", target="branch", ratio=0.5)
    # MixGRPO: a window of 4 SDE steps, one step later every `window_every` iterations, never on the
    # last two steps, back to the start once it reaches them
    mix_window = WindowSchedule(kind="progressive", target="sde", shift=1, every=window_every, roll_back=True)
    splits = (0, 3, 6)  # BranchGRPO's dense splits (0, 3, 6, 9 of 20) scaled to 10 steps, k = 3
    between = tuple(s for s in ALL_SDE if s not in splits)
    flat = TreeSpec(T, sde_steps=ALL_SDE, num_trees=LEAVES, ode_tail=ODE_TAIL)
    shared = dataclasses.replace(flat, shared_noise=True)  # DanceGRPO: one root noise per prompt's group
    branch = TreeSpec(T, branch_steps=splits, branching=3, sde_steps=between, ode_tail=ODE_TAIL)
    tree = TreeSpec(T, branch_steps=(0, 1, 2), branching=3, window=tree_window, ode_tail=ODE_TAIL)
    fusion = AdvantageSettings(method="branch_fusion", beta=0.0, clip=5.0)  # TREE_PROB_WEIGHTED=false
    return {
        m.name: m
        for m in [
            Method("dancegrpo", "flat G=27, DanceGRPO SDE (eta 0.3), shared root noise, a random 60% of the "
                   "steps trained, 3 optimizer steps per rollout", shared,
                   dynamics="dance_sde", noise_level=0.3, schedule={"step_fraction": 0.6},
                   flat=True, minibatches=3,
                   follows="XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py, scripts/finetune/finetune_flux_grpo.sh"),  # fmt: skip
            Method("flowgrpo", "flat G=27, Flow-GRPO SDE (a 0.7), global-std advantages, KL 0.04 (Flow-GRPO "
                   "form), 2 optimizer steps per rollout", flat,
                   advantage=AdvantageSettings(std_scope="global"), flat=True, minibatches=2,
                   kl_beta=0.04, kl_form="flow_grpo", lr_grid=HIGHER_GRID,
                   follows="yifan123/flow_grpo config/grpo.py (geneval_sd3), scripts/train_sd3.py"),  # fmt: skip
            Method("mixgrpo", "flat G=27, Flow-GRPO SDE (a 0.7) in a window of 4 steps sliding forward and "
                   "rolling back, ODE elsewhere, 4 optimizer steps per rollout",
                   TreeSpec(T, sde_steps=(0, 1, 2, 3), num_trees=LEAVES, window=mix_window, ode_tail=ODE_TAIL,
                            shared_noise=True),
                   flat=True, minibatches=4,
                   lr_grid=FLAT_GRID + (3e-3,),  # 1e-3 won the first three: the grid goes one further
                   follows="Tencent-Hunyuan/MixGRPO scripts/finetune/finetune_flux_grpo_MixGRPO.sh, "
                           "fastvideo/utils/grpo_states.py"),  # fmt: skip
            Method("treegrpo", "k=3 on a window of 3 steps (geometric start), mean backup, 2 optimizer steps "
                   "per rollout", tree, minibatches=2, lr_grid=HIGHER_GRID,
                   follows="zh-ding/TreeGRPO train.py (vendored in MAIR-Lab-HUST/TMPO TreeGRPO-main)"),  # fmt: skip
            Method("treegrpo_softmax", "as treegrpo, log-prob softmax backup (TreeGRPO paper)", tree,
                   advantage=AdvantageSettings(method="logprob_softmax"), minibatches=2,
                   follows="TreeGRPO paper, Algorithm 1"),  # fmt: skip
            Method("branchgrpo", "k=3 splits at 0,3,6, DanceGRPO SDE (eta 0.3) on every step, reward fusion "
                   "+ depth-wise advantages, clip 1e-3, an optimizer step every 12 edges", branch,
                   advantage=fusion, dynamics="dance_sde", noise_level=0.3, clip_range=1e-3,
                   edges_per_update=12, lr_grid=HIGHER_EDGEWISE_GRID,
                   follows="Fredreic1849/BranchGRPO fastvideo/train_branchgrpo_flux.py, "
                           "scripts/finetune/finetune_flux_branchgrpo_8gpus.sh"),  # fmt: skip
            Method("branchgrpo_pruned", "branchgrpo + width (parent-top1) and depth pruning (the 2 deepest "
                   "trained depths dropped, the window sliding towards the root)", branch,
                   advantage=fusion, dynamics="dance_sde", noise_level=0.3, clip_range=1e-3,
                   edges_per_update=12, lr_grid=EDGEWISE_GRID,
                   # width pruning all along: a budgeted run has no length for width_fraction to divide;
                   # depths 15-18 of 20 sliding to 9 in the script -> [6, 8) of 8 sliding to 4
                   schedule={"width": "parent_top1", "depth_window": 2, "depth_start": 6, "depth_mode": "drop",
                             "depth_direction": "shallower", "depth_every": window_every, "depth_stop": 4},
                   follows="Fredreic1849/BranchGRPO --depth_pruning, --depth_pruning_slide, --width_pruning_mode 1"),  # fmt: skip
            Method("branchgrpo_mix", "k=3 splits at 0,3,6 plus the SDE window over the first steps (0, 1), "
                   "ODE elsewhere, only SDE edges trained",
                   TreeSpec(T, branch_steps=splits, branching=3, sde_steps=(1,), ode_tail=ODE_TAIL),
                   advantage=fusion, dynamics="dance_sde", noise_level=0.3, clip_range=1e-3,
                   edges_per_update=12, lr_grid=EDGEWISE_GRID,
                   # the code's window starts at (step // slide_interval) * slide_interval: with an
                   # interval (30) above the step count it is the first mix_sde_window_size steps
                   follows="Fredreic1849/BranchGRPO --mix_ode_sde_tree --mix_sde_window_size 4 (of 20 steps)"),  # fmt: skip
        ]
    }


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------


class ModelCallTimer:
    """Wraps ``adapter.predict``: seconds spent in model calls inside training rollouts (not the
    training forwards, nor the KL reference's, nor the evaluation samples)."""

    def __init__(self, predict: Callable) -> None:
        self.predict = predict
        self.rollout_seconds = 0.0
        self.enabled = True  # off during held-out evaluation
        self.in_rollout = False  # set by :meth:`wrap_rollout`

    def wrap_rollout(self, rollout_fn: Callable) -> Callable:
        """``rollout_fn`` with this timer counting the model calls made inside it."""

        def timed(*args, **kwargs):
            self.in_rollout = True
            try:
                return rollout_fn(*args, **kwargs)
            finally:
                self.in_rollout = False

        return timed

    def __call__(self, x, step_index, cond):
        if not (self.enabled and self.in_rollout):
            return self.predict(x, step_index, cond)
        start = time.perf_counter()
        out = self.predict(x, step_index, cond)
        self.rollout_seconds += time.perf_counter() - start
        return out


@dataclass
class Run:
    """What one method's run recorded."""

    iterations: list[dict[str, float]] = field(default_factory=list)
    curve: list[dict[str, float]] = field(default_factory=list)


class Recorder:
    """A Lightning callback: records every training step's costs, evaluates the held-out reward
    every ``eval_every`` iterations (and before the first), stops when both budgets are spent (or
    after ``max_iterations``)."""

    def __init__(self, module: TreeGRPOModule, timer: ModelCallTimer, eval_prompts: list[str], eval_seeds: int,
                 eval_every: int, nfe_budget: float, seconds_budget: float, max_iterations: int) -> None:  # fmt: skip
        import lightning.pytorch as pl

        self.module, self.timer = module, timer
        self.eval_prompts, self.eval_seeds, self.eval_every = eval_prompts, eval_seeds, eval_every
        self.nfe_budget, self.seconds_budget = nfe_budget, seconds_budget
        self.max_iterations = max_iterations
        self.run = Run()
        self.nfe = self.train_nfe = self.seconds = 0.0
        self.optimizer_steps = 0
        recorder = self

        class _Callback(pl.Callback):
            def on_train_start(self, trainer, pl_module):
                recorder.evaluate()

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                recorder.timer.rollout_seconds = 0.0

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                recorder.step(trainer)

        self.callback = _Callback()

    def step(self, trainer: Any) -> None:
        m = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("time/", "nfe/"))}
        total = m["time/rollout_s"] + m["time/reward_s"] + m["time/advantages_s"] + m["time/train_s"]
        self.nfe += m["nfe/rollout"]
        self.train_nfe += m["nfe/train"]
        self.seconds += total
        self.optimizer_steps = trainer.global_step
        self.run.iterations.append({
            "rollout_s": m["time/rollout_s"], "reward_s": m["time/reward_s"],
            "advantages_s": m["time/advantages_s"], "train_s": m["time/train_s"], "total_s": total,
            "model_calls_s": self.timer.rollout_seconds, "nfe": m["nfe/rollout"], "train_nfe": m["nfe/train"],
        })  # fmt: skip
        iteration = len(self.run.iterations)
        done = (self.nfe >= self.nfe_budget and self.seconds >= self.seconds_budget) or iteration >= self.max_iterations
        if iteration % self.eval_every == 0 or done:
            self.evaluate()
        if done:
            trainer.should_stop = True

    @torch.no_grad()
    def evaluate(self) -> None:
        self.timer.enabled = False
        module = self.module
        images = torch.cat([module.sample(self.eval_prompts, seed) for seed in range(self.eval_seeds)])
        prompts = self.eval_prompts * self.eval_seeds
        reward = float(ShapesReward()(images, prompts).mean())
        diversity = SampleDiversity()
        diversity.update(images, prompts)
        self.timer.enabled = True
        self.run.curve.append({
            "iteration": len(self.run.iterations), "nfe": self.nfe, "total_nfe": self.nfe + self.train_nfe,
            "optimizer_steps": self.optimizer_steps, "seconds": self.seconds, "reward": reward,
            "diversity": float(diversity.compute()),
        })  # fmt: skip


def run_method(method: Method, seed: int, lr: float, args: argparse.Namespace) -> Run:
    """Train ``method`` from the shipped weights at learning rate ``lr`` until both budgets are spent."""
    from lightning.pytorch import Trainer, seed_everything

    seed_everything(seed, verbose=False)
    tree = method.tree
    if tree.window is not None:  # the window's draws are part of what a seed varies
        tree = dataclasses.replace(tree, window=dataclasses.replace(tree.window, seed=seed))
    adapter = ShapesAdapter(num_steps=T, dynamics=method.dynamics, noise_level=method.noise_level)
    timer = ModelCallTimer(adapter.predict)
    adapter.predict = timer  # the module and the rollout call adapter.predict
    module = TreeGRPOModule(
        adapter,
        "shapes",
        tree,
        advantage=method.advantage,
        loss=ClippedPolicyLoss(clip_range=method.clip_range, kl_beta=method.kl_beta, kl_form=method.kl_form),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.0),
        minibatches=method.minibatches,
        edges_per_update=method.edges_per_update,
        accumulate=args.accumulate if method.flat else 1,
        seed=seed,
    )
    # one held-out split and one prompt order for every method and seed: seeds vary the sampling
    data = PromptDataModule("shapes_world", batch_size=args.batch_size, val_fraction=0.1, val_size=36, seed=0)
    eval_prompts = data.val_set.prompts
    recorder = Recorder(module, timer, eval_prompts, args.eval_seeds, args.eval_every, args.nfe_budget, args.seconds,
                        args.max_iterations)  # fmt: skip
    callbacks = [recorder.callback]
    if method.schedule:
        callbacks.append(PruningSchedule(**method.schedule, seed=seed))
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=-1,  # the recorder stops the run
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    # the module's own rollout, timed: its model calls are the rollout's share that is not bookkeeping
    with mock.patch.object(module_code, "rollout", timer.wrap_rollout(module_code.rollout)):
        trainer.fit(module, data)
    return recorder.run


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What makes a cached run reusable: a run with other budgets or batch is trained again."""
    keys = ("nfe_budget", "seconds", "batch_size", "accumulate", "eval_every", "eval_seeds", "max_iterations")
    return {k: getattr(args, k) for k in keys}


def cached_run(method: Method, seed: int, lr: float, args: argparse.Namespace) -> Run:
    """:func:`run_method`, or its result from ``--out``/runs when an earlier call finished it."""
    path = args.out / "runs" / f"{method.name}_lr{lr:g}_seed{seed}.json"
    settings = run_settings(args)
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved["settings"] == settings:
            print(f"{method.name} lr {lr:g} seed {seed}: cached in {path}", flush=True)
            return Run(saved["iterations"], saved["curve"])
    t0 = time.perf_counter()
    run = run_method(method, seed, lr, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": settings, "threads": torch.get_num_threads(),
                               "iterations": run.iterations, "curve": run.curve}))  # fmt: skip
    tmp.replace(path)  # a run interrupted while writing leaves no half file behind
    print(f"{method.name} lr {lr:g} seed {seed}: {len(run.iterations)} iterations, reward "
          f"{run.curve[0]['reward']:.3f} -> {run.curve[-1]['reward']:.3f} in {time.perf_counter() - t0:.0f} s",
          flush=True)  # fmt: skip
    return run


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------


def first_reaching(curve: list[dict[str, float]], target: float, key: str) -> float | None:
    """``key`` of the first evaluation at or above ``target`` (``None``: never reached)."""
    for point in curve:
        if point["reward"] >= target:
            return point[key]
    return None


def spread(values: list[float | None]) -> dict[str, Any]:
    """Mean, min and max of the values that exist, and how many do (``reached``)."""
    got = [v for v in values if v is not None]
    if not got:
        return {"mean": None, "min": None, "max": None, "reached": 0}
    return {"mean": statistics.fmean(got), "min": min(got), "max": max(got), "reached": len(got)}


def to_target(run: Run, target: float) -> dict[str, float | None]:
    """Sampling NFE, total NFE and seconds of the first evaluation at or above ``target``."""
    return {key: first_reaching(run.curve, target, curve_key)
            for key, curve_key in (("nfe", "nfe"), ("total_nfe", "total_nfe"), ("seconds", "seconds"))}  # fmt: skip


def summarise(name: str, runs: list[Run], target: float, dance_target: float) -> dict[str, Any]:
    """Per-method numbers, as means with spreads (min, max) over seeds."""
    per_seed = []
    for run in runs:
        its = run.iterations[1:] or run.iterations  # the first iteration pays one-off warm-up costs
        mean = lambda k: statistics.fmean(i[k] for i in its)  # noqa: E731
        bookkeeping = [(i["rollout_s"] - i["model_calls_s"] + i["advantages_s"]) / i["total_s"] for i in its]
        reach, reach_dance = to_target(run, target), to_target(run, dance_target)
        per_seed.append({
            "seconds_per_iteration": {k: mean(f"{k}_s") for k in ("rollout", "reward", "advantages", "train", "total")},
            "nfe_per_iteration": {"sampling": mean("nfe"), "training": mean("train_nfe")},
            "iterations": len(run.iterations),
            "optimizer_steps": run.curve[-1]["optimizer_steps"],
            "wall_clock_s": run.curve[-1]["seconds"],
            "reward_start": run.curve[0]["reward"],
            "reward_end": run.curve[-1]["reward"],
            "reward_best": max(p["reward"] for p in run.curve),
            "diversity_start": run.curve[0]["diversity"],
            "diversity_end": run.curve[-1]["diversity"],
            "nfe_to_target": reach["nfe"],
            "total_nfe_to_target": reach["total_nfe"],
            "seconds_to_target": reach["seconds"],
            "nfe_to_dancegrpo_target": reach_dance["nfe"],
            "seconds_to_dancegrpo_target": reach_dance["seconds"],
            "bookkeeping_fraction": statistics.fmean(bookkeeping),
        })  # fmt: skip
    out: dict[str, Any] = {"seeds": len(runs), "curves": [r.curve for r in runs], "per_seed": per_seed}
    out["seconds_per_iteration"] = {k: spread([s["seconds_per_iteration"][k] for s in per_seed])
                                    for k in per_seed[0]["seconds_per_iteration"]}  # fmt: skip
    out["nfe_per_iteration"] = {k: spread([s["nfe_per_iteration"][k] for s in per_seed]) for k in ("sampling", "training")}
    for key in per_seed[0]:
        if key not in ("seconds_per_iteration", "nfe_per_iteration"):
            out[key] = spread([s[key] for s in per_seed])
    return out


def speedup_to(base: dict[str, Any], mine: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The baseline's mean ``key`` (NFE or seconds to a target) over each of this method's seeds':
    ``mean`` is the ratio of the means, ``min`` / ``max`` the per-seed spread; None if either side
    never reached the target."""
    theirs = base[key]["mean"]
    seeds = [s[key] for s in mine["per_seed"] if s[key]]
    if not theirs or not seeds:
        return None
    ratios = [theirs / v for v in seeds]
    return {"mean": theirs / statistics.fmean(seeds), "min": min(ratios), "max": max(ratios), "reached": len(seeds)}


def add_speedups(results: dict[str, dict[str, Any]], best_flat: str, target: float, dance_target: float) -> None:
    """``speedup_vs_dancegrpo``: DanceGRPO's time per iteration and its NFE / time to its own mean
    final reward, over the method's; ``speedup_vs_best_flat``: the same to the best flat baseline's
    mean final reward (the run's target)."""
    base, best = results["dancegrpo"], results[best_flat]
    for r in results.values():
        tpi = base["seconds_per_iteration"]["total"]["mean"] / r["seconds_per_iteration"]["total"]["mean"]
        r["speedup_vs_dancegrpo"] = {
            "target": dance_target,
            "time_per_iteration": tpi,
            "time_to_target": speedup_to(base, r, "seconds_to_dancegrpo_target"),
            "nfe_to_target": speedup_to(base, r, "nfe_to_dancegrpo_target"),
        }
        r["speedup_vs_best_flat"] = {
            "baseline": best_flat,
            "target": target,
            "time_per_iteration": best["seconds_per_iteration"]["total"]["mean"] / r["seconds_per_iteration"]["total"]["mean"],
            "time_to_target": speedup_to(best, r, "seconds_to_target"),
            "nfe_to_target": speedup_to(best, r, "nfe_to_target"),
        }


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or (abs(value) >= 100 and float(value).is_integer()):
        return f"{int(value)}"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def fmt_speedup(stat: dict[str, Any] | None) -> str:
    """``2.1x [1.8, 2.5]`` (ratio of means, per-seed spread), or a dash when not reached."""
    if stat is None:
        return "—"
    if stat["min"] == stat["max"]:
        return f"{fmt(stat['mean'])}x"
    return f"{fmt(stat['mean'])}x [{fmt(stat['min'])}, {fmt(stat['max'])}]"


def fmt_spread(stat: dict[str, Any], digits: int = 3) -> str:
    """``mean`` alone for one seed, ``mean [min, max]`` over several."""
    if stat["mean"] is None or stat["min"] == stat["max"]:
        return fmt(stat["mean"], digits)
    return f"{fmt(stat['mean'], digits)} [{fmt(stat['min'], digits)}, {fmt(stat['max'], digits)}]"


def table(results: dict[str, dict[str, Any]], target: float) -> str:
    """The Markdown summary, every number formatted from ``results``."""
    lines = [
        f"Held-out ShapesReward target: {fmt(target, 4)} (the best flat baseline's mean final reward); "
        "mean [min, max] over seeds",
        "",
        "| method | s / iteration (rollout + reward + adv + train) | NFE / iteration (sampling + training) "
        "| speed-up / iteration vs DanceGRPO | reward start → end | diversity start → end "
        "| NFE to target | s to target | speed-up to target vs best flat | bookkeeping |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s, n = r["seconds_per_iteration"], r["nfe_per_iteration"]
        parts = " + ".join(fmt(s[k]["mean"]) for k in ("rollout", "reward", "advantages", "train"))
        lines.append(
            f"| {name} | {fmt_spread(s['total'])} ({parts}) | {fmt(n['sampling']['mean'])} + {fmt(n['training']['mean'])} "
            f"| {fmt(r['speedup_vs_dancegrpo']['time_per_iteration'])}x "
            f"| {fmt(r['reward_start']['mean'])} → {fmt_spread(r['reward_end'])} "
            f"| {fmt(r['diversity_start']['mean'])} → {fmt_spread(r['diversity_end'])} "
            f"| {fmt_spread(r['nfe_to_target'])} ({r['nfe_to_target']['reached']}/{r['seeds']}) "
            f"| {fmt_spread(r['seconds_to_target'])} "
            f"| {fmt_speedup(r['speedup_vs_best_flat']['time_to_target'])} "
            f"| {fmt(100 * r['bookkeeping_fraction']['mean'], 2)}% |"
        )
    return "\n".join(lines)


def plots(results: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, label, name in (("nfe", "sampling NFE (cumulative, all prompts of the run)", "reward_vs_nfe.png"),
                             ("seconds", "training wall-clock (s, evaluation excluded)", "reward_vs_wallclock.png")):  # fmt: skip
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for method, r in results.items():
            for i, curve in enumerate(r["curves"]):
                ax.plot([p[key] for p in curve], [p["reward"] for p in curve], marker=".",
                        color=f"C{list(results).index(method)}", alpha=0.9 if i == 0 else 0.4,
                        label=method if i == 0 else None)  # fmt: skip
        ax.set_xlabel(label)
        ax.set_ylabel("held-out ShapesReward")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = list(results)
    bottom = [0.0] * len(names)
    for k, colour in (("rollout", "C0"), ("reward", "C1"), ("advantages", "C2"), ("train", "C3")):
        values = [results[n]["seconds_per_iteration"][k]["mean"] for n in names]
        ax.bar(names, values, bottom=bottom, label=k, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("seconds per iteration")
    ax.legend()
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(out / "iteration_time.png", dpi=120)
    plt.close(fig)
    written.append(out / "iteration_time.png")
    return written


# ---------------------------------------------------------------------------------------------
# entry
# ---------------------------------------------------------------------------------------------


DEFAULT_SWEEP = Path(__file__).resolve().parent / "results" / "shapes_cpu" / "sweep.json"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for results.json (or sweep.json), the plots and runs/")
    p.add_argument("--quick", action="store_true", help="seed 0 only, small budgets: under 10 minutes on 2 cores")
    p.add_argument("--sweep", action="store_true",
                   help="train every method at each learning rate of its grid on the sweep seeds and write "
                        "sweep.json / sweep.md (the rate with the best mean final held-out reward)")  # fmt: skip
    p.add_argument("--methods", nargs="+", default=None,
                   help="subset of methods (a comparison always runs dancegrpo: it is the reference)")  # fmt: skip
    p.add_argument("--seed-list", type=int, nargs="+", default=None,
                   help=f"seeds (default {' '.join(map(str, REPORT_SEEDS))}; quick 0; sweep "
                        f"{' '.join(map(str, SWEEP_SEEDS))})")  # fmt: skip
    p.add_argument("--nfe-budget", type=float, default=None, help="sampling NFE per run (default 40k, as the sweep; quick 8k)")
    p.add_argument("--seconds", type=float, default=0.0, help="least training wall-clock per run, besides the NFE budget")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per iteration (default 8 as configs/shapes.yaml, quick 4)")
    p.add_argument("--runs-only", action="store_true",
                   help="train (and cache under --out/runs) the listed methods and seeds, then stop without "
                        "a report: several such processes share a comparison, a last call without it reports")  # fmt: skip
    p.add_argument("--lr", type=float, default=None, help="one AdamW learning rate for every method (instead of --lrs)")
    p.add_argument("--lrs", type=Path, default=DEFAULT_SWEEP,
                   help="sweep.json whose chosen rate each method takes (default: the committed sweep); a method "
                        "missing from it takes the middle of its grid")  # fmt: skip
    p.add_argument("--accumulate", type=int, default=8, help="micro-batches per optimizer step of the flat methods (memory)")
    p.add_argument("--eval-every", type=int, default=5, help="iterations between held-out evaluations")
    p.add_argument("--eval-seeds", type=int, default=2, help="samples per held-out prompt")
    p.add_argument("--target", type=float, default=None,
                   help="held-out reward target; default: the best flat baseline's mean final reward")  # fmt: skip
    p.add_argument("--max-iterations", type=int, default=100_000, help="safety cap on iterations per run")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    args = p.parse_args(argv)
    default_seeds = SWEEP_SEEDS if args.sweep else ((0,) if args.quick else REPORT_SEEDS)
    args.seed_list = list(args.seed_list or default_seeds)
    if args.nfe_budget is None:
        args.nfe_budget = 8_000 if args.quick else 40_000  # the comparison runs as long as the sweep did
    args.batch_size = args.batch_size or (4 if args.quick else 8)
    if args.eval_every < 1 or args.eval_seeds < 1 or args.batch_size < 1:
        p.error("--eval-every, --eval-seeds and --batch-size must be >= 1")
    if args.sweep and args.lr is not None:
        p.error("--sweep tries each method's learning-rate grid; leave out --lr")
    if not (args.sweep or args.runs_only) and set(args.seed_list) & set(SWEEP_SEEDS):
        p.error(f"seeds {sorted(set(args.seed_list) & set(SWEEP_SEEDS))} chose the learning rates (--sweep); "
                "report other seeds")  # fmt: skip
    known = methods(window_every=10)
    chosen = args.methods or list(known)
    unknown = [m for m in chosen if m not in known]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {', '.join(known)}")
    reference = args.sweep or args.runs_only  # a report needs dancegrpo, its reference
    args.methods = chosen if reference else ["dancegrpo"] + [m for m in chosen if m != "dancegrpo"]
    return args


def learning_rates(args: argparse.Namespace, known: dict[str, Method]) -> tuple[dict[str, float], str]:
    """Each method's learning rate and where it came from."""
    if args.lr is not None:
        return {name: args.lr for name in args.methods}, "--lr"
    chosen = {}
    if args.lrs.is_file():
        chosen = {k: v["chosen_lr"] for k, v in json.loads(args.lrs.read_text())["methods"].items()}
    lrs = {}
    for name in args.methods:
        grid = known[name].lr_grid
        lrs[name] = chosen.get(name, grid[len(grid) // 2])
        if name not in chosen:
            print(f"{name}: no swept learning rate in {args.lrs}; taking the middle of its grid, {lrs[name]:g}")
    return lrs, str(args.lrs)


def sweep(args: argparse.Namespace, known: dict[str, Method]) -> dict[str, Any]:
    """Every method at each rate of its grid on the sweep seeds; the best mean final reward wins.
    Methods already in ``--out``/sweep.json and not run now keep their entries (with their seeds),
    so separate calls, e.g. one per process, build one sweep."""
    path = args.out / "sweep.json"
    report: dict[str, Any] = {"settings": settings_of(args), "methods": {}}
    if path.is_file():
        earlier = json.loads(path.read_text())
        if run_settings(argparse.Namespace(**earlier["settings"])) != run_settings(args):
            raise SystemExit(f"{path} was swept with other budgets ({earlier['settings']}); use another --out")
        report["methods"] = {k: v for k, v in earlier["methods"].items() if k not in args.methods}
    for name in args.methods:
        grid = []
        for lr in known[name].lr_grid:
            finals = [cached_run(known[name], seed, lr, args).curve[-1]["reward"] for seed in args.seed_list]
            grid.append({"lr": lr, "final_reward": finals, "mean": statistics.fmean(finals)})
        best = max(grid, key=lambda g: g["mean"])
        report["methods"][name] = {"grid": grid, "chosen_lr": best["lr"], "seeds": args.seed_list,
                                   "follows": known[name].follows}  # fmt: skip
    if path.is_file():  # another process may have added methods while these ran
        earlier = json.loads(path.read_text())["methods"]
        report["methods"] = {**{k: v for k, v in earlier.items() if k not in args.methods}, **report["methods"]}
    report["methods"] = {name: report["methods"][name] for name in known if name in report["methods"]}
    path.write_text(json.dumps(report, indent=2))
    text = sweep_table(report)
    (args.out / "sweep.md").write_text(text + "\n")
    print(f"wrote {args.out / 'sweep.json'}\n\n{text}")
    return report


def sweep_table(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"Learning-rate sweep: final held-out ShapesReward, mean over the sweep seeds "
        f"({fmt(s['nfe_budget'])} sampling NFE, {s['batch_size']} prompts per iteration); chosen rate in bold",
        "",
        "| method | seeds | learning rate: final reward (per seed) |",
        "|---|---|---|",
    ]
    for name, m in report["methods"].items():
        cells = []
        for g in m["grid"]:
            text = f"{g['lr']:g}: {g['mean']:.3f} ({', '.join(f'{v:.3f}' for v in g['final_reward'])})"
            cells.append(f"**{text}**" if g["lr"] == m["chosen_lr"] else text)
        lines.append(f"| {name} | {', '.join(map(str, m['seeds']))} | {'; '.join(cells)} |")
    return "\n".join(lines)


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="lightning")
    args.out.mkdir(parents=True, exist_ok=True)
    known = methods(window_every=10)
    if args.sweep:
        return sweep(args, known)
    lrs, lr_source = learning_rates(args, known)
    started = time.perf_counter()
    runs = {name: [cached_run(known[name], seed, lrs[name], args) for seed in args.seed_list] for name in args.methods}
    if args.runs_only:
        return {"runs": {name: len(rs) for name, rs in runs.items()}}
    finals = {name: statistics.fmean(r.curve[-1]["reward"] for r in rs) for name, rs in runs.items()}
    best_flat = max((n for n in runs if known[n].flat), key=finals.__getitem__)
    target = args.target if args.target is not None else finals[best_flat]
    results = {name: summarise(name, rs, target, finals["dancegrpo"]) for name, rs in runs.items()}
    add_speedups(results, best_flat, target, finals["dancegrpo"])
    for name in results:
        results[name]["description"] = known[name].description
        results[name]["follows"] = known[name].follows
        results[name]["lr"] = lrs[name]
    report = {
        "settings": settings_of(args),
        "learning_rates_from": lr_source,
        "target_reward": target,
        "best_flat": best_flat,
        "leaves_per_prompt": LEAVES,
        "num_steps": T,
        "ode_tail": ODE_TAIL,
        "threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - started,
        "methods": results,
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    for path in plots(results, args.out):
        print(f"wrote {path}")
    print(f"wrote {args.out / 'results.json'} ({report['seconds']:.0f} s)\n")
    print(table(results, target))
    return report


if __name__ == "__main__":
    main()
