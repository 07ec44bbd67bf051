"""Run records written by hand into a cache, for the tests of the comparison's plan and report (they
read curves and counts; which model made a curve does not matter to them)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from compare.methods import RunSpec, resolved_config
from compare.runs import RunCache


def write(
    cache: RunCache,
    spec: RunSpec,
    rewards: list[float],
    *,
    iterations: int = 5,
    config: dict[str, Any] | None = None,
    **extra: object,
) -> None:
    """A finished run of ``spec`` whose held-out curve is ``rewards`` at every evaluation of the
    cache's protocol from 0, after ``iterations`` identical iterations; ``config`` (the method's
    resolved preset by default) and ``extra`` fields, e.g. the run's seconds, go into the record."""
    every = cache.protocol.every
    points = [
        {"units": every * i, "sampling_nfe": 10.0 * i, "reward": r, "reward_se": 0.001, "reward_per_seed": [r, r]}
        for i, r in enumerate(rewards)
    ]
    its = [{"sampling": 8.0, "trained": 4.0, "reference": 0.0, "reward_images": 2.0, "units": 20.0}] * iterations
    record = {
        "identity": {"protocol": asdict(cache.protocol)},
        "spec": asdict(spec),
        "config": resolved_config(spec) if config is None else config,
        "iterations": its,
        "curve": points,
        **extra,
    }
    cache.folder.mkdir(parents=True, exist_ok=True)
    cache.path(spec).write_text(json.dumps(record))
