"""The compared methods: one preset each in ``configs/methods/`` (the only place a method is
written), composed with the Shapes task config exactly as a user composes them::

    python -m lit_treegrpo fit --config configs/shapes.yaml --config configs/methods/mixgrpo.yaml

:func:`run_args` is that command line plus the run's learning rate and seed; :func:`build` parses
it with the project's own CLI (:class:`~lit_treegrpo.cli.TreeGRPOCLI`), so the module, the data and
the training callbacks the benchmark trains are the ones ``fit`` would train.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.training.resume import ADAPTER_MEMORY_OPTIONS
from lit_treegrpo.training.settings import AdvantageSettings

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "configs" / "methods"
SCREEN = Path(__file__).resolve().parent / "screen"
"""The fidelity screen's arms: one file each, composed after its base preset (:data:`ARMS`)."""
TASK = REPO / "configs" / "shapes.yaml"

HEADLINE = ("treegrpo", "mixgrpo", "dancegrpo", "flowgrpo", "branchgrpo")
"""The five methods reported at 10 seeds each, paired by seed."""
VARIANTS = ("treegrpo_softmax", "branchgrpo_pruned", "branchgrpo_mix")
"""Variants of a headline method, run at that method's chosen rate (not swept on their own)."""
OFFICIAL = ("treegrpo_official", "branchgrpo_official")
"""Each paper's method with every setting as its official code has it (the fidelity screen)."""
VARIANT_OF = {"treegrpo_softmax": "treegrpo", "branchgrpo_pruned": "branchgrpo", "branchgrpo_mix": "branchgrpo"}
ARMS = {
    "branchgrpo_binary": "branchgrpo",
    "branchgrpo_split_noise": "branchgrpo",
    "branchgrpo_updates": "branchgrpo",
    "branchgrpo_equal_weight": "branchgrpo",
    "treegrpo_official_window": "treegrpo_official",
}
"""The screen's arms (``SCREEN/<arm>.yaml``), each one setting changed alone on its base preset: an
official-code setting on today's BranchGRPO, or the official TreeGRPO's window schedule stretched
over the budget (docs/benchmarks.md, the fidelity screen)."""
REMEDIES = {
    "treegrpo_parent_relative": "treegrpo",
    "treegrpo_tmpo": "treegrpo",
    "treegrpo_mix_updates": "treegrpo",
}
"""The remedy screen's arms ("A tree that pays", docs/benchmarks.md): presets in ``configs/methods``, each one
change from the method it names, trained beside it on the screen's seeds and rates (``plan.remedy_jobs``)."""
FLAT = ("dancegrpo", "flowgrpo", "mixgrpo")
"""The flat baselines (independent chains, no shared prefix)."""

# Learning-rate grids (AdamW on the rank-16 LoRA): three rates 3x apart for every method, centred
# where the 40k-NFE sweep of the earlier protocol put each method's stable rates. BranchGRPO steps
# once per 12 trained edges (tens of optimizer steps per rollout), hence its lower grid. A grid
# whose best rate lies at an edge is moved one step of the series that way (:func:`shifted_grid`).
GRIDS: dict[str, tuple[float, ...]] = {
    "treegrpo": (1e-4, 3e-4, 1e-3),
    "mixgrpo": (1e-4, 3e-4, 1e-3),
    "dancegrpo": (1e-4, 3e-4, 1e-3),
    "flowgrpo": (3e-4, 1e-3, 3e-3),
    "branchgrpo": (3e-5, 1e-4, 3e-4),
}

# Observers never change what trains (tests/callbacks/test_integration.py checks grids, tree views
# and EMA against a run without them); the benchmark leaves them out, and refuses any other
# callback it does not know, so that nothing that changes training is dropped silently.
TRAINING_CALLBACKS = ("PruningSchedule",)
OBSERVER_CALLBACKS = ("RewardMetrics", "SampleGridLogger", "TreeView", "EMA", "SampleDiversity", "ModelCheckpoint")


def method_names() -> list[str]:
    """Every preset in ``configs/methods`` and every screen arm (sorted)."""
    return sorted([p.stem for p in PRESETS.glob("*.yaml")] + list(ARMS))


def preset(name: str) -> Path:
    """The file that states ``name``: its preset, or a screen arm's own file."""
    path = SCREEN / f"{name}.yaml" if name in ARMS else PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown method {name!r}: no {path}; choose from {', '.join(method_names())}")
    return path


def preset_files(name: str) -> list[Path]:
    """The config files of ``name`` in the order ``fit`` composes them (a screen arm after its base)."""
    return [preset(ARMS[name]), preset(name)] if name in ARMS else [preset(name)]


@functools.cache
def _parser(task: Path = TASK) -> Any:
    """The project CLI's parser (built once: it instantiates the task's model one time)."""
    from lit_treegrpo.cli import TreeGRPOCLI

    return TreeGRPOCLI(args=["--config", str(task), "--trainer.logger", "false"], run=False).parser


def resolved_config(spec: RunSpec, task: Path = TASK) -> dict[str, Any]:
    """The whole configuration ``fit`` resolves from :func:`run_args` (defaults included), without
    building anything."""
    parser = _parser(task)
    return json.loads(parser.dump(parser.parse_args(run_args(spec, task)), format="json", skip_none=False))


def training_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What a resolved configuration trains, and nothing else: the model, reward, tree (its
    ``num_steps`` the adapter's when the tree leaves it out), advantages, loss, updates, optimizer
    (but its rate, which names the run), compute cost, the training callbacks and the data. Two
    configurations with the same identity train the same run; a cached run whose recorded
    configuration has another identity than the current files is trained again."""
    model = config["model"]
    adapter = dict(model["adapter"])
    # options that bound memory or speed only (a resume may change them): not what the run trains,
    # and a cached run recorded before one of them existed is the same run
    adapter["init_args"] = {
        k: v for k, v in (adapter.get("init_args") or {}).items() if k not in ADAPTER_MEMORY_OPTIONS
    }
    tree = dict(model["tree"])
    if tree.get("num_steps") is None:
        tree["num_steps"] = adapter["init_args"]["num_steps"]
    tree = _without_field_defaults(tree, TreeSpec)
    optimizer = dict(model.get("optimizer") or {})
    if "init_args" in optimizer:
        optimizer["init_args"] = {k: v for k, v in optimizer["init_args"].items() if k != "lr"}
    callbacks = [
        _without_defaults(c)
        for c in config["trainer"].get("callbacks") or []
        if c["class_path"].rsplit(".", 1)[-1] in TRAINING_CALLBACKS
    ]
    keys = (
        "reward",
        "reward_kwargs",
        "loss",
        "minibatches",
        "edges_per_update",
        "accumulate",
        "inner_epochs",
        "grad_clip",
        "lr_scheduler",
        "compute_cost",
    )
    return {
        "adapter": adapter,
        "tree": tree,
        **{k: model.get(k) for k in keys},
        "advantage": _without_field_defaults(model.get("advantage") or {}, AdvantageSettings),
        "optimizer": optimizer,
        "callbacks": callbacks,
        "data": config["data"],
    }


def _without_field_defaults(options: dict[str, Any], cls: type) -> dict[str, Any]:
    """``options`` of the dataclass ``cls`` without the fields at their defaults: a field added later,
    at a default that keeps the old behaviour (``tree.split_noise_scale``,
    ``advantage.std_estimator``), leaves the cached runs' identity as it was."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in options.items() if k not in defaults or v != defaults[k]}


#: callback options removed since runs were recorded, at the value every run had while they existed
REMOVED_CALLBACK_DEFAULTS = {"extreme_n": 1}


def _without_defaults(callback: dict[str, Any]) -> dict[str, Any]:
    """A callback's configuration without the options at their defaults: an option added later,
    at a default that keeps the old behaviour, or removed at the value it had
    (:data:`REMOVED_CALLBACK_DEFAULTS`), leaves the cached runs' identity as it was."""
    module, _, name = callback["class_path"].rpartition(".")
    defaults = {
        k: p.default
        for k, p in inspect.signature(getattr(importlib.import_module(module), name)).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    removed = {k: v for k, v in REMOVED_CALLBACK_DEFAULTS.items() if k not in defaults}
    args = {
        k: v
        for k, v in (callback.get("init_args") or {}).items()
        if (k not in defaults or v != defaults[k]) and (k not in removed or v != removed[k])
    }
    return {**callback, "init_args": args}


def description(name: str) -> str:
    """The preset's header comment, as one paragraph (its first block of comment lines)."""
    lines = []
    for line in preset(name).read_text().splitlines():
        if not line.startswith("#") or line.strip() == "#":
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


def neighbour(rate: float, up: bool) -> float:
    """The next rate of the 1-3-10 series (..., 1e-4, 3e-4, 1e-3, ...) above or below ``rate``."""
    exponent = math.floor(math.log10(rate) + 1e-9)
    mantissa = round(rate / 10**exponent)
    if mantissa not in (1, 3):
        raise ValueError(f"learning rate {rate:g} is not on the 1-3-10 series of the grids")
    if up:
        return float(f"3e{exponent}") if mantissa == 1 else float(f"1e{exponent + 1}")
    return float(f"1e{exponent}") if mantissa == 3 else float(f"3e{exponent - 1}")


def shifted_grid(grid: tuple[float, ...], best: float) -> tuple[float, ...] | None:
    """The grid moved one step towards ``best`` when ``best`` is at an edge (``None``: inside)."""
    if best == grid[0]:
        return (neighbour(grid[0], up=False), *grid[:-1])
    if best == grid[-1]:
        return (*grid[1:], neighbour(grid[-1], up=True))
    return None


@dataclass(frozen=True)
class RunSpec:
    """One training run of the comparison."""

    method: str
    lr: float
    seed: int

    @property
    def key(self) -> str:
        return f"{self.method}_lr{self.lr:g}_seed{self.seed}"


def run_args(spec: RunSpec, task: Path = TASK) -> list[str]:
    """The ``fit`` arguments of ``spec``: the task config, the method's preset, and the run's rate
    and seed (``--model.seed`` seeds the rollouts, the window and the pruning draws alike; the
    held-out split and the prompt order stay the task's, the same for every method and seed)."""
    presets = [arg for path in preset_files(spec.method) for arg in ("--config", str(path))]
    return [
        "--config", str(task),
        *presets,
        "--model.optimizer.init_args.lr", repr(spec.lr),
        "--model.seed", str(spec.seed),
        "--seed_everything", str(spec.seed),
    ]  # fmt: skip


def build(spec: RunSpec, root: Path, task: Path = TASK) -> tuple[Any, Any, list[Any], dict[str, Any]]:
    """The module, data module and training callbacks of ``spec``, parsed and instantiated by the
    project's CLI from :func:`run_args`; and the resolved configuration (for the run's record)."""
    from lit_treegrpo.cli import TreeGRPOCLI

    args = [*run_args(spec, task), "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
            "--trainer.default_root_dir", str(root)]  # fmt: skip
    cli = TreeGRPOCLI(args=args, run=False)
    callbacks = []
    # the configs' own callbacks come first in the Trainer's list (the CLI appends its run-folder ones)
    configured = len(cli.config["trainer"].get("callbacks") or [])
    for callback in (cli.config_init["trainer"].get("callbacks") or [])[:configured]:
        kind = type(callback).__name__
        if kind in TRAINING_CALLBACKS:
            callbacks.append(callback)
        elif kind not in OBSERVER_CALLBACKS:
            raise ValueError(
                f"{' or '.join(map(str, preset_files(spec.method)))} or {task} adds the callback {kind}, which the benchmark does not "
                "know: list it in benchmarks/compare/methods.py as training or observer"
            )
    config = json.loads(cli.parser.dump(cli.config, format="json", skip_none=False))
    return cli.model, cli.datamodule, callbacks, {"args": args, "config": config}
