"""How far apart the samples of one prompt lie: the measure of mode collapse that the reward alone cannot show.

Pure torch; used by the ``RewardMetrics`` callback (``diversity``, ``val/diversity``) and by the method
comparison's held-out evaluations (benchmarks/compare/runs.py).
"""

from __future__ import annotations

import torch
from torch import Tensor


def mean_pairwise_rms(x: Tensor) -> Tensor:
    """Mean RMS distance over the ordered pairs i != j of the rows of ``x`` [n, D] (n >= 2), float64: the
    distance of two rows is ``||x_i - x_j|| / sqrt(D)``, so it reads in the units of one coordinate."""
    n, dim = x.shape
    if n < 2:
        raise ValueError(f"a spread needs two or more samples, got {n}")
    x = x.double()
    d = torch.cdist(x, x) / dim**0.5  # [n, n]
    return d.sum() / (n * (n - 1))


def spread_per_prompt(features: Tensor) -> Tensor:
    """[P] float64 within-prompt spread of ``features`` [S, P, D]: for each of P prompts, the mean pairwise RMS
    distance between its S samples (S >= 2)."""
    if features.ndim != 3:
        raise ValueError(f"features must be [samples, prompts, dims], got {tuple(features.shape)}")
    return torch.stack([mean_pairwise_rms(features[:, p]) for p in range(features.shape[1])])
