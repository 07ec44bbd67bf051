"""The comparison's plots: held-out reward against compute, against sampling NFE and (with a timing)
against seconds, each method's seed mean with its 95% bootstrap band, drawn from ``results.json``'s
reported curves."""

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
    """``reward_vs_compute.png``, ``reward_vs_nfe.png`` and ``reward_vs_seconds.png`` (when the
    report has a seconds axis) in ``out``; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    axes = [
        ("units", "compute units (sampling + 3 x trained + reference forwards)", "reward_vs_compute.png"),
        ("sampling_nfe", "sampling NFE (rollout forwards)", "reward_vs_nfe.png"),
    ]
    rates = (report.get("seconds") or {}).get("seconds_per_unit", {})
    if rates:
        axes.append(
            (
                "seconds_axis",
                "seconds (counted units x the method's measured seconds per unit)",
                "reward_vs_seconds.png",
            )
        )
    for key, label, name in axes:
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for i, (method, m) in enumerate(report["methods"].items()):
            curves = m["curves"]
            if key == "seconds_axis":
                if method not in rates:
                    continue
                curves = [[{**p, "seconds_axis": p["units"] * rates[method]} for p in c] for c in curves]
            xs, band = _band(curves, key)
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
