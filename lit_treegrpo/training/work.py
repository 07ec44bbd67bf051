"""How long a phase may run. The work estimate: what one training iteration and one validation pass cost in
denoiser evaluations, and how large one sample is, checked against bounds a user can raise (``--model.work_limit``)
before any model loads, so that a mistyped ``1e9`` is a one-line refusal instead of a process that runs for days.
And the stop request (SIGTERM, Ctrl-C), read before every model call of a rollout or sampling pass
(:func:`stoppable`) and after every optimizer step of an update, so that no phase outlasts it by more than one call.

A denoiser evaluation is one sample through one denoising step (classifier-free guidance's second row and a KL
reference's forward are not counted: both are fixed factors of a configuration, and the bound is far from any real
run). The estimate is an upper bound: pruning and faults only remove work."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import Tensor

from ..core.spec import TreeSpec

#: whether a stop (SIGTERM, Ctrl-C) was asked for
StopCheck = Callable[[], bool]


@dataclass(frozen=True)
class WorkLimit:
    """``--model.work_limit``: the most work one phase may ask for; raise a bound knowingly for a run that needs it."""

    max_evaluations: int = 1_000_000
    """Most denoiser evaluations of one training iteration on one process (rollout and update epochs) and of one
    validation pass (prompts x ``val_samples`` x steps). The main job's iteration costs 1,720 and its validation
    1,440; 16 prompts of a 16-leaf tree over 20 steps cost 4,576: the default is hundreds of times any of these."""
    max_sample_pixels: int = 64 * 2**20
    """Most pixels of one sample (resolution squared, times the frames of a video): 64 Mi is 8192 x 8192."""

    def __post_init__(self) -> None:
        for name in ("max_evaluations", "max_sample_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"work_limit.{name} must be a whole number >= 1, got {value!r}")


class WorkLimitError(ValueError):
    """A configuration whose estimate is over a ``--model.work_limit`` bound (a configuration error)."""


def _over(what: str, estimate: int, limit: WorkLimit, fix: str) -> WorkLimitError:
    return WorkLimitError(
        f"{what} would cost {estimate:,} denoiser evaluations, more than --model.work_limit.max_evaluations "
        f"{limit.max_evaluations:,}; {fix}, or raise --model.work_limit.max_evaluations knowingly"
    )


def check_steps(option: str, num_steps: int, limit: WorkLimit) -> None:
    """Refuse a ``num_steps`` (given as ``option``) over the bound on its own, in constant time: one trajectory costs
    that many evaluations, and the tree's own checks loop over the steps."""
    if num_steps > limit.max_evaluations:
        raise _over(f"{option} {num_steps:,}: one trajectory", num_steps, limit, f"give a smaller {option}")


def check_iteration_work(spec: TreeSpec, prompts: int, inner_epochs: int, limit: WorkLimit) -> int:
    """Refuse a training iteration of ``prompts`` prompts per process over ``limit``; its evaluations otherwise.
    The lower bound (every tree's roots through every step) is checked first, in constant time, so that a huge
    ``num_steps`` is refused before anything loops over the steps."""
    assert spec.num_steps is not None, "the tree's num_steps comes from the adapter before the estimate"
    fix = (
        "lower --data.batch_size, --model.inner_epochs, --model.tree.branching or --model.tree.num_trees, or "
        "--model.adapter.init_args.num_steps"
    )
    what = f"one training iteration ({prompts} prompt(s) x {spec.num_trees} tree(s) x {spec.num_steps:,} steps"
    floor = prompts * spec.num_trees * spec.num_steps
    if floor > limit.max_evaluations:
        raise _over(what + ", before branching)", floor, limit, fix)
    rollout = prompts * spec.nfe()
    update = prompts * spec.train_nfe() * inner_epochs  # one forward per parent of the kept edges, per epoch
    if rollout + update > limit.max_evaluations:
        detail = f"): rollout {rollout:,} + update {update:,} ({inner_epochs:,} inner epoch(s))"
        raise _over(what + detail, rollout + update, limit, fix)
    return rollout + update


def check_validation_work(num_steps: int, prompts: int, val_samples: int, limit: WorkLimit) -> int:
    """Refuse a validation pass over ``limit``: ``prompts`` held-out prompts x ``val_samples`` x ``num_steps``."""
    cost = prompts * val_samples * num_steps
    if cost > limit.max_evaluations:
        raise _over(
            f"one validation pass ({prompts:,} prompt(s) x --model.val_samples {val_samples:,} x {num_steps:,} steps)",
            cost,
            limit,
            "lower --model.val_samples, --data.val_size or --model.adapter.init_args.num_steps",
        )
    return cost


def check_sample_size(resolution: int, frames: int, limit: WorkLimit) -> int:
    """Refuse a sample of ``resolution`` squared x ``frames`` pixels over ``limit.max_sample_pixels``: the memory
    guard's probe and every rollout hold such samples, so this comes before either allocates one."""
    pixels = resolution * resolution * frames
    if pixels > limit.max_sample_pixels:
        size = f"{resolution:,} x {resolution:,}" + (f" x {frames:,} frames" if frames > 1 else "")
        raise WorkLimitError(
            f"--model.adapter.init_args.resolution {resolution:,}: one sample of {size} is {pixels:,} pixels, more "
            f"than --model.work_limit.max_sample_pixels {limit.max_sample_pixels:,}; give a smaller resolution"
            f"{' or num_frames' if frames > 1 else ''}, or raise --model.work_limit.max_sample_pixels knowingly"
        )
    return pixels


def _whole(value: Any) -> int | None:
    """``value`` as an int when it is a number (not a bool); None otherwise (another check names it)."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def check_configured_steps(limit: WorkLimit, tree_steps: Any, adapter_steps: Any) -> None:
    """The steps as given (``--model.tree.num_steps``, ``--model.adapter.init_args.num_steps``), before a tree is
    built with them: its own checks loop over the steps, and 1e18 would never end."""
    for option, steps in (
        ("--model.tree.num_steps", tree_steps),
        ("--model.adapter.init_args.num_steps", adapter_steps),
    ):
        if _whole(steps) is not None:
            check_steps(option, int(steps), limit)


def check_configured_work(
    limit: WorkLimit, tree: TreeSpec, adapter_args: Mapping[str, Any], *, inner_epochs: int, val_samples: int,
    prompts: int, val_prompts: int,
) -> None:  # fmt: skip
    """Everything the options say enough to estimate: the sample size when the resolution is given, the iteration
    (``prompts`` per process) and the validation pass (``val_prompts``) when the tree's steps are known."""
    resolution = _whole(adapter_args.get("resolution"))
    if resolution is not None:
        check_sample_size(resolution, _whole(adapter_args.get("num_frames")) or 1, limit)
    if tree.num_steps is None:
        return  # the adapter's own default, checked by the module once it is built
    check_iteration_work(tree, prompts, inner_epochs, limit)
    check_validation_work(tree.num_steps, val_prompts, val_samples, limit)


def check_module_work(
    stage: str, spec: TreeSpec, datamodule: Any, val_samples: int, limit: WorkLimit, *, inner_epochs: int
) -> None:
    """The estimate of a module's ``stage`` (``fit``: the iteration and the validation; ``validate`` / ``test``: the
    evaluation) on ``datamodule``'s prompts, before any sample is drawn."""
    if stage == "fit":
        check_iteration_work(spec, datamodule.per_rank_batch_size(), inner_epochs, limit)
    if stage in ("fit", "validate", "test"):
        assert spec.num_steps is not None
        check_validation_work(spec.num_steps, len(datamodule.val_set.prompts), val_samples, limit)


# ---------------------------------------------------------------------------------------------- stop requests
class StopRequested(Exception):
    """A stop asked for while samples were drawn: the rollout or sampling ended at its next model call and nothing of
    it is kept (the weights are those of the iteration before)."""


class StoppedUpdate(NamedTuple):
    """An update that a stop ended between two optimizer steps: ``done`` of ``planned`` steps ran and are kept."""

    iteration: int
    done: int
    planned: int

    def __str__(self) -> str:
        return (
            f"Stopped iteration {self.iteration}'s update after {self.done} of its {self.planned} optimizer steps; the "
            f"checkpoint keeps those steps, and a resumed run goes on with iteration {self.iteration + 1} (it no "
            "longer matches an uninterrupted run from here)"
        )


def stoppable(predict: Callable[[Tensor, Any, Any], Tensor], stop: StopCheck | None) -> Any:
    """``predict`` with the stop check before each call (one or more per denoising step): :class:`StopRequested`."""
    if stop is None:
        return predict

    def checked(x: Tensor, t: Any, cond: Any) -> Tensor:
        if stop():
            raise StopRequested
        return predict(x, t, cond)

    return checked
