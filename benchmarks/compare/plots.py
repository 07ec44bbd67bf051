"""The comparison's plots: held-out reward against compute and against sampling NFE, each method's
seed mean with its 95% bootstrap band, drawn from ``results.json``'s reported curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import stats


def _band(
    curves: list[list[dict[str, float]]], key: str, points: int = 40
) -> tuple[list[float], list[dict[str, float]]]:
    """Each seed's curve on ``key``, interpolated on a common grid up to the shortest seed's end,
    with the bootstrap CI of the mean at every point."""
    end = min(c[-1][key] for c in curves)
    xs = [end * i / (points - 1) for i in range(points)]
    per = [[(p[key], p["reward"]) for p in c] for c in curves]
    return xs, [stats.bootstrap([stats.at(c, x) for c in per], resamples=1000) for x in xs]


def draw(report: dict[str, Any], out: Path) -> list[Path]:
    """``reward_vs_compute.png`` and ``reward_vs_nfe.png`` in ``out``; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, label, name in (
        ("units", "compute units (sampling + 3 x trained + reference forwards)", "reward_vs_compute.png"),
        ("sampling_nfe", "sampling NFE (rollout forwards)", "reward_vs_nfe.png"),
    ):
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for i, (method, m) in enumerate(report["methods"].items()):
            xs, band = _band(m["curves"], key)
            ax.plot(xs, [b["mean"] for b in band], color=f"C{i}", label=f"{method} ({m['n']} seeds)")
            ax.fill_between(xs, [b["lo"] for b in band], [b["hi"] for b in band], color=f"C{i}", alpha=0.15)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out ShapesReward (mean, 95% CI)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    return written
