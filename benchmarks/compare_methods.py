"""TreeGRPO against DanceGRPO, Flow-GRPO, MixGRPO and BranchGRPO, side by side in one run.

Every method is a configuration of the one :class:`~lit_treegrpo.module.TreeGRPOModule` (tree,
advantage estimator, SDE, pruning), trained on the Shapes world from the same shipped weights, the
same prompts and the same seeds, with the same optimizer, learning rate and batch of prompts, and
27 leaves per prompt for all of them (flat methods: G = 27 chains). Each run lasts until it has spent
the sampling-NFE budget *and* the wall-clock budget, so both comparisons come from the same run.

Recorded per method (results.json, one object per method; means and spreads over seeds):

- seconds per iteration, split into rollout / reward / advantages+pruning / training;
- NFE per iteration: sampling (rollout) and training (forwards recomputing log-probs);
- the held-out reward curve (deterministic samples of the held-out prompts, never trained on)
  against sampling NFE, total NFE, optimizer steps and wall-clock (evaluation time excluded);
- the within-prompt diversity of those samples (mean pairwise RMS distance over seeds);
- NFE and wall-clock to reach the target reward; speed-ups relative to DanceGRPO;
- tree bookkeeping: the share of iteration time spent in the rollout engine outside model calls,
  in the advantage backup and in pruning.

Outputs in ``--out``: ``results.json``, ``reward_vs_nfe.png``, ``reward_vs_wallclock.png``,
``iteration_time.png``; the Markdown table is printed last, formatted from the JSON's numbers.

    python benchmarks/compare_methods.py --quick --out runs/bench     # < 10 minutes on 2 cores
    python benchmarks/compare_methods.py --out runs/bench_full        # 3 seeds, longer budgets
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lit_treegrpo.callbacks import PruningSchedule, SampleDiversity
from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec
from lit_treegrpo.core.spec import WindowSchedule
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.shapes import ShapesAdapter
from lit_treegrpo.module import AdvantageSettings, TreeGRPOModule
from lit_treegrpo.rewards import ShapesReward

T = 10  # denoising steps of every method (the papers' NFE = 10 setting)
LEAVES = 27  # leaves per prompt of every method
ALL_SDE = tuple(range(T - 1))  # every step but the last


@dataclass(frozen=True)
class Method:
    """One method as a configuration of TreeGRPOModule."""

    name: str
    description: str
    tree: TreeSpec
    advantage: AdvantageSettings = AdvantageSettings()
    dynamics: str = "flow_sde"
    noise_level: float = 0.7
    shared_noise: bool = False
    clip_range: float = 1e-4
    schedule: dict[str, Any] | None = None  # PruningSchedule options
    flat: bool = False


def methods(window_every: int) -> dict[str, Method]:
    """The compared methods, all with 27 leaves per prompt over 10 steps (see PAPERS.md)."""
    tree_window = WindowSchedule(kind="geometric", target="branch", ratio=0.5)
    mix_window = WindowSchedule(kind="progressive", target="sde", shift=1, every=window_every)
    splits = (0, 3, 6)  # BranchGRPO's dense splits (0, 3, 6, 9 of 20) scaled to 10 steps, k = 3
    return {
        m.name: m
        for m in [
            Method("dancegrpo", "flat G=27, DanceGRPO SDE (eta 0.3) on every step, shared root noise, "
                   "a random 60% of the steps trained", TreeSpec(T, sde_steps=ALL_SDE, num_trees=LEAVES),
                   dynamics="dance_sde", noise_level=0.3, shared_noise=True, schedule={"step_fraction": 0.6},
                   flat=True),  # fmt: skip
            Method("flowgrpo", "flat G=27, Flow-GRPO SDE (a 0.7) on every step, no KL",
                   TreeSpec(T, sde_steps=ALL_SDE, num_trees=LEAVES), flat=True),  # fmt: skip
            Method("mixgrpo", "flat G=27, SDE window of 4 steps sliding forward, ODE elsewhere",
                   TreeSpec(T, sde_steps=(0, 1, 2, 3), num_trees=LEAVES, window=mix_window),
                   dynamics="dance_sde", noise_level=0.3, shared_noise=True, flat=True),  # fmt: skip
            Method("treegrpo", "k=3 on a window of 3 steps (geometric start), mean backup",
                   TreeSpec(T, branch_steps=(0, 1, 2), branching=3, window=tree_window)),  # fmt: skip
            Method("treegrpo_softmax", "as treegrpo, log-prob softmax backup (TreeGRPO paper)",
                   TreeSpec(T, branch_steps=(0, 1, 2), branching=3, window=tree_window),
                   advantage=AdvantageSettings(method="logprob_softmax")),  # fmt: skip
            Method("branchgrpo", "k=3 splits at 0,3,6, SDE on every step, reward fusion + depth-wise "
                   "advantages, clip 1e-3", TreeSpec(T, branch_steps=splits, branching=3,
                                                     sde_steps=tuple(s for s in ALL_SDE if s not in splits)),
                   advantage=AdvantageSettings(method="branch_fusion", beta=1.0, clip=5.0),
                   dynamics="dance_sde", noise_level=0.3, clip_range=1e-3),  # fmt: skip
            Method("branchgrpo_pruned", "branchgrpo + width (parent-top1) and depth pruning (a window of "
                   "4 depths sliding deeper)", TreeSpec(T, branch_steps=splits, branching=3,
                                                    sde_steps=tuple(s for s in ALL_SDE if s not in splits)),
                   advantage=AdvantageSettings(method="branch_fusion", beta=1.0, clip=5.0),
                   dynamics="dance_sde", noise_level=0.3, clip_range=1e-3,
                   # width pruning all along: a budgeted run has no length for width_fraction to divide
                   schedule={"width": "parent_top1", "depth_window": 4, "depth_every": window_every,
                             "depth_stop": 5}),  # fmt: skip
            Method("branchgrpo_mix", "k=3 splits at 0,3,6 plus a sliding window of 2 SDE steps, ODE "
                   "elsewhere", TreeSpec(T, branch_steps=splits, branching=3, sde_steps=(1, 2),
                                         window=WindowSchedule(kind="progressive", target="sde", every=window_every)),
                   advantage=AdvantageSettings(method="branch_fusion", beta=1.0, clip=5.0),
                   dynamics="dance_sde", noise_level=0.3, clip_range=1e-3),  # fmt: skip
        ]
    }


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------


class ModelCallTimer:
    """Wraps ``adapter.predict``: seconds spent in model calls during rollouts (no grad)."""

    def __init__(self, predict: Callable) -> None:
        self.predict = predict
        self.rollout_seconds = 0.0
        self.enabled = True

    def __call__(self, x, step_index, cond):
        if not self.enabled or torch.is_grad_enabled():  # training recomputes with grad
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
    every ``eval_every`` iterations (and before the first), stops when both budgets are spent."""

    def __init__(self, module: TreeGRPOModule, timer: ModelCallTimer, eval_prompts: list[str], eval_seeds: int,
                 eval_every: int, nfe_budget: float, seconds_budget: float) -> None:  # fmt: skip
        import lightning.pytorch as pl

        self.module, self.timer = module, timer
        self.eval_prompts, self.eval_seeds, self.eval_every = eval_prompts, eval_seeds, eval_every
        self.nfe_budget, self.seconds_budget = nfe_budget, seconds_budget
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
        done = self.nfe >= self.nfe_budget and self.seconds >= self.seconds_budget
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


def run_method(method: Method, seed: int, args: argparse.Namespace) -> Run:
    """Train ``method`` from the shipped weights until both budgets are spent."""
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
        loss=ClippedPolicyLoss(clip_range=method.clip_range),
        optimizer=lambda params: torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0),
        accumulate=args.accumulate if method.flat else 1,
        seed=seed,
        shared_noise=method.shared_noise,
    )
    # one held-out split and one prompt order for every method and seed: seeds vary the sampling
    data = PromptDataModule("shapes_world", batch_size=args.batch_size, val_fraction=0.1, val_size=36, seed=0)
    eval_prompts = data.val_set.prompts
    recorder = Recorder(module, timer, eval_prompts, args.eval_seeds, args.eval_every, args.nfe_budget, args.seconds)
    callbacks = [recorder.callback]
    if method.schedule:
        callbacks.append(PruningSchedule(**method.schedule, seed=seed))
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_iterations,  # one optimizer step per iteration (minibatches = 1)
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(module, data)
    return recorder.run


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------


def first_reaching(curve: list[dict[str, float]], target: float, key: str) -> float | None:
    """``key`` of the first evaluation at or above ``target`` (``None``: never reached)."""
    for point in curve:
        if point["reward"] >= target:
            return point[key]
    return None


def summarise(name: str, runs: list[Run], target: float) -> dict[str, Any]:
    """Per-method numbers, as means with spreads (min, max) over seeds."""

    def spread(values: list[float | None]) -> dict[str, Any]:
        got = [v for v in values if v is not None]
        if not got:
            return {"mean": None, "min": None, "max": None, "reached": 0}
        return {"mean": statistics.fmean(got), "min": min(got), "max": max(got), "reached": len(got)}

    per_seed = []
    for run in runs:
        its = run.iterations[1:] or run.iterations  # the first iteration pays one-off warm-up costs
        mean = lambda k: statistics.fmean(i[k] for i in its)  # noqa: E731
        bookkeeping = [(i["rollout_s"] - i["model_calls_s"] + i["advantages_s"]) / i["total_s"] for i in its]
        per_seed.append({
            "seconds_per_iteration": {k: mean(f"{k}_s") for k in ("rollout", "reward", "advantages", "train", "total")},
            "nfe_per_iteration": {"sampling": mean("nfe"), "training": mean("train_nfe")},
            "iterations": len(run.iterations),
            "optimizer_steps": run.curve[-1]["optimizer_steps"],
            "wall_clock_s": run.curve[-1]["seconds"],
            "reward_start": run.curve[0]["reward"],
            "reward_end": run.curve[-1]["reward"],
            "diversity_start": run.curve[0]["diversity"],
            "diversity_end": run.curve[-1]["diversity"],
            "nfe_to_target": first_reaching(run.curve, target, "nfe"),
            "total_nfe_to_target": first_reaching(run.curve, target, "total_nfe"),
            "seconds_to_target": first_reaching(run.curve, target, "seconds"),
            "bookkeeping_fraction": statistics.fmean(bookkeeping),
        })  # fmt: skip
    out: dict[str, Any] = {"seeds": len(runs), "curves": [r.curve for r in runs]}
    out["seconds_per_iteration"] = {k: spread([s["seconds_per_iteration"][k] for s in per_seed])
                                    for k in per_seed[0]["seconds_per_iteration"]}  # fmt: skip
    out["nfe_per_iteration"] = {k: spread([s["nfe_per_iteration"][k] for s in per_seed]) for k in ("sampling", "training")}
    for key in ("iterations", "optimizer_steps", "wall_clock_s", "reward_start", "reward_end", "diversity_start",
                "diversity_end", "nfe_to_target", "total_nfe_to_target", "seconds_to_target", "bookkeeping_fraction"):  # fmt: skip
        out[key] = spread([s[key] for s in per_seed])
    return out


def add_speedups(results: dict[str, dict[str, Any]]) -> None:
    """``speedup_vs_dancegrpo``: DanceGRPO's time per iteration / time to target over the method's."""
    base = results["dancegrpo"]
    for r in results.values():
        tpi = base["seconds_per_iteration"]["total"]["mean"] / r["seconds_per_iteration"]["total"]["mean"]
        mine, theirs = r["seconds_to_target"]["mean"], base["seconds_to_target"]["mean"]
        r["speedup_vs_dancegrpo"] = {
            "time_per_iteration": tpi,
            "time_to_target": theirs / mine if mine and theirs else None,
        }


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) or (abs(value) >= 100 and float(value).is_integer()):
        return f"{int(value)}"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def fmt_spread(stat: dict[str, Any], digits: int = 3) -> str:
    """``mean`` alone for one seed, ``mean [min, max]`` over several."""
    if stat["mean"] is None or stat["min"] == stat["max"]:
        return fmt(stat["mean"], digits)
    return f"{fmt(stat['mean'], digits)} [{fmt(stat['min'], digits)}, {fmt(stat['max'], digits)}]"


def table(results: dict[str, dict[str, Any]], target: float) -> str:
    """The Markdown summary, every number formatted from ``results``."""
    lines = [
        f"Held-out ShapesReward target: {fmt(target, 4)}; mean [min, max] over seeds",
        "",
        "| method | s / iteration (rollout + reward + adv + train) | NFE / iteration (sampling + training) "
        "| speed-up / iteration vs DanceGRPO | reward start → end | diversity start → end "
        "| NFE to target | s to target | speed-up to target | bookkeeping |",
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
            f"| {fmt(r['speedup_vs_dancegrpo']['time_to_target'])}{'x' if r['speedup_vs_dancegrpo']['time_to_target'] else ''} "
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


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for results.json and the plots")
    p.add_argument("--quick", action="store_true", help="one seed, small budgets: under 10 minutes on 2 cores")
    p.add_argument("--methods", nargs="+", default=None, help="subset of methods (dancegrpo is always run: it is the reference)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per method (default 3, quick 1)")
    p.add_argument("--nfe-budget", type=float, default=None, help="sampling NFE per method run (default 160k, quick 30k)")
    p.add_argument("--seconds", type=float, default=None, help="training wall-clock per method run (default 60, quick 0)")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per iteration (default 8 as configs/shapes.yaml, quick 4)")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate of every method (the LoRA of configs/shapes.yaml)")
    p.add_argument("--accumulate", type=int, default=8, help="micro-batches per optimizer step of the flat methods (memory)")
    p.add_argument("--eval-every", type=int, default=None, help="iterations between held-out evaluations")
    p.add_argument("--eval-seeds", type=int, default=2, help="samples per held-out prompt")
    p.add_argument("--target", type=float, default=None,
                   help="held-out reward target; default: halfway from the base reward to the best method's peak")  # fmt: skip
    p.add_argument("--max-iterations", type=int, default=100_000, help="safety cap on iterations per run")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the benchmark runs alone)")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.nfe_budget = args.nfe_budget if args.nfe_budget is not None else (30_000 if args.quick else 160_000)
    args.seconds = args.seconds if args.seconds is not None else (0.0 if args.quick else 60.0)
    args.batch_size = args.batch_size or (4 if args.quick else 8)
    args.eval_every = args.eval_every or 10
    known = methods(window_every=10)
    chosen = args.methods or list(known)
    unknown = [m for m in chosen if m not in known]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {', '.join(known)}")
    args.methods = ["dancegrpo"] + [m for m in chosen if m != "dancegrpo"]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="lightning")
    args.out.mkdir(parents=True, exist_ok=True)
    known = methods(window_every=10)
    started = time.perf_counter()
    runs: dict[str, list[Run]] = {}
    for name in args.methods:
        runs[name] = []
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            run = run_method(known[name], seed, args)
            runs[name].append(run)
            print(f"{name} seed {seed}: {len(run.iterations)} iterations, reward {run.curve[0]['reward']:.3f} -> "
                  f"{run.curve[-1]['reward']:.3f} in {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    base = statistics.fmean(r.curve[0]["reward"] for rs in runs.values() for r in rs)
    best = max(statistics.fmean(max(p["reward"] for p in r.curve) for r in rs) for rs in runs.values())
    target = args.target if args.target is not None else base + 0.5 * (best - base)
    results = {name: summarise(name, rs, target) for name, rs in runs.items()}
    add_speedups(results)
    for name in results:
        results[name]["description"] = known[name].description
    report = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "target_reward": target,
        "leaves_per_prompt": LEAVES,
        "num_steps": T,
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
