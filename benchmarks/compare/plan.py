"""The protocol's order of work, fixed before any run: tune each headline method on the sweep seeds,
choose its rate by the stated rule, fix the targets from the sweep seeds, then train the reported
seeds at the chosen rates.

- Sweep: every rate of the method's grid (:data:`~.methods.GRIDS`) on :data:`SWEEP_SEEDS`, at the
  report's budget. The rate with the best :func:`~.stats.selection_score` (mean minus one sd of
  the runs' plateaus) is chosen; when it is at an edge of the grid, the grid moves one step that
  way and the new rate is trained too, until the choice is inside (the grid stays three rates).
- Targets, from the sweep seeds only: the plateau (mean over the sweep seeds of the mean of the last
  three evaluations) of the best flat baseline at its chosen rate, and DanceGRPO's.
- Reported: :data:`REPORT_SEEDS` for each headline method at its chosen rate; the variants
  (:data:`~.methods.VARIANTS`) at their headline method's rate on :data:`VARIANT_SEEDS`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from . import stats
from .methods import FLAT, GRIDS, HEADLINE, OFFICIAL, REMEDIES, VARIANT_OF, VARIANTS, RunSpec, neighbour, shifted_grid
from .runs import Protocol, Run, RunCache

SWEEP_SEEDS = (100, 101, 102)
REPORT_SEEDS = tuple(range(10))
VARIANT_SEEDS = tuple(range(5))


@dataclass(frozen=True)
class Design:
    """Which runs the comparison needs: the protocol of each run, the seeds and the grids."""

    protocol: Protocol = Protocol()
    sweep_seeds: tuple[int, ...] = SWEEP_SEEDS
    report_seeds: tuple[int, ...] = REPORT_SEEDS
    variant_seeds: tuple[int, ...] = VARIANT_SEEDS
    grids: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(GRIDS))
    headline: tuple[str, ...] = HEADLINE
    variants: tuple[str, ...] = VARIANTS
    official: tuple[str, ...] = ()
    """Swept and reported like the headline methods, compared with them in the fidelity table but
    kept out of the headline pairs and targets (``methods.OFFICIAL``). Without a grid of its own,
    an official preset's grid comes from the fidelity screen (:func:`screen_grid`)."""
    extension_seeds: tuple[int, ...] = ()
    """Reported seeds beyond ``report_seeds`` of MixGRPO and the TreeGRPO that settles the pair
    (:func:`extended`), trained after everything else."""

    def __post_init__(self) -> None:
        reported = set(self.report_seeds) | set(self.variant_seeds) | set(self.extension_seeds)
        both = set(self.sweep_seeds) & reported
        if both:
            raise ValueError(f"seeds {sorted(both)} would both tune and be reported; keep them apart")

    @property
    def swept(self) -> tuple[str, ...]:
        """Every method with a sweep of its own: the headline methods, then the official presets."""
        return (*self.headline, *self.official)


# The comparison as first run (benchmarks/results/shapes_cpu): TreeGRPO's curve had not flattened at
# its 300k budget. The budget pilots (benchmarks/budget_pilot.py, benchmarks/results/shapes_cpu_pilot)
# then fixed the next one before its runs: MixGRPO's two-seed mean rises to 0.81 at 450k and holds
# 0.80-0.82 to 750k (flat within 0.004 from 480k to 540k); TreeGRPO's peaks at 0.78 near 360k and
# collapses after 400k at its 300k rate. 540k units covers both, with evaluations still 30k apart, so
# runs of a longer design extend these from their checkpoints (runs.RunCache.start).
FIRST = Design(protocol=Protocol(budget=300_000.0, evaluations=10))
LONG = Design(protocol=Protocol(budget=540_000.0, evaluations=18))
# At 540k (benchmarks/results/shapes_cpu_long) the sweep chose TreeGRPO's 1e-4, the best final mean,
# and its curve had not flattened. A pilot of TreeGRPO at 1e-4 (sweep seeds 100 and 101, to 1.08M
# units) then fixed this design before its runs: its mean peaks at 0.805 at 630k, holds 0.79-0.80 to
# 960k and falls after 990k; at 750k its last three evaluations are flat even at the noise of a
# ten-seed mean, and 750k is inside MixGRPO's pilot plateau (0.80-0.82 from 450k to 750k). The
# evaluation spacing stays 30k, so the 540k runs extend from their checkpoints.
PLATEAU = Design(protocol=Protocol(budget=750_000.0, evaluations=25))
# At 750k (benchmarks/results/shapes_cpu_750k) TreeGRPO's ten-seed curve passes the plateau check;
# the docs report this budget, since 2026-12-06 as the settled design below (``FULL``).
# The ceilings (docs/benchmarks.md, "Settling the verdict"), fixed before their runs: each headline
# method still rising at 750k, at its 750k-chosen rate (no sweep of its own), seeds 0-4, to a cap of
# 1.2M units with the same evaluation spacing (in benchmarks/results/shapes_cpu_1200k).
CEILING = Design(protocol=Protocol(budget=1_200_000.0, evaluations=40), report_seeds=tuple(range(5)), variants=())
# treegrpo_official added 2026-12-06 23:05, before any ceiling run (docs/benchmarks.md): its 750k
# runs rise too, and the official presets' ceilings extend their 750k checkpoints
CEILING_ORDER = ("dancegrpo", "flowgrpo", "branchgrpo", "branchgrpo_official", "treegrpo_official")
QUICK = Design(
    protocol=Protocol(budget=15_000.0, evaluations=3, eval_seeds=2),
    sweep_seeds=(100,),
    report_seeds=(0, 1),
    variant_seeds=(),
    grids={m: (g[1],) for m, g in GRIDS.items()},  # one rate: the quick run checks the machinery, not the rates
    variants=(),
)
# The fidelity screen's full protocol and the verdict's extension (docs/benchmarks.md), fixed before
# their runs: the 750k design with the official presets swept and reported (grids from the screen)
# and MixGRPO and the settling TreeGRPO extended to 26 paired seeds.
SETTLED = Design(protocol=PLATEAU.protocol, official=OFFICIAL, extension_seeds=tuple(range(10, 26)))
# The comparison the docs report and the default of ``compare_methods.py --design``: the settled
# design, once the official presets had all their reported seeds (its report says "Interim" while
# the extension runs; the same runs as the 750k design's, plus the official presets and extension).
FULL = SETTLED
DESIGNS = {"540k": LONG, "750k": PLATEAU, "750k+": SETTLED, "300k": FIRST, "quick": QUICK}
"""The designs ``compare_methods.py --design`` names; ``FULL`` is the one the docs report."""


# The fidelity screen (docs/benchmarks.md), fixed before its runs: each setting in which
# configs/methods/branchgrpo.yaml departs from BranchGRPO's official code changed alone (the screen
# arms, methods.ARMS), all of them together (branchgrpo_official), and treegrpo_official against
# treegrpo, at the comparison's 750k protocol on two sweep seeds. The rates: BranchGRPO's chosen 1e-5
# and 1e-4, where today's preset peaks and collapses; branchgrpo_official also at 3e-4, DanceGRPO's
# chosen rate (its script uses DanceGRPO's rate); TreeGRPO's chosen 1e-4 and its 3e-4. The learning-
# rate departure alone is today's preset at DanceGRPO's rate, a sweep run already cached.
SCREEN_SEEDS = (100, 101)
SCREEN_RATES: dict[str, tuple[float, ...]] = {
    "branchgrpo_official": (1e-5, 1e-4, 3e-4),
    "branchgrpo_binary": (1e-5, 1e-4),
    "branchgrpo_split_noise": (1e-5, 1e-4),
    "branchgrpo_updates": (1e-5, 1e-4),
    "branchgrpo_equal_weight": (1e-5, 1e-4),
    "treegrpo_official": (1e-4, 3e-4),
    # added before its runs, after treegrpo_official's collapse (docs/benchmarks.md): paired with it
    "treegrpo_official_window": (1e-4, 3e-4),
}
# Added before its runs, once branchgrpo_official's full-protocol sweep had chosen 3e-5, a rate the
# screen did not run (docs/benchmarks.md): every BranchGRPO arm there, so that the screen can say which
# ingredient the official preset's stability at that rate comes from. branchgrpo_official's and
# branchgrpo's runs at 3e-5 on the screen's seeds are sweep runs already cached. screen_grid does not
# read these: the official presets' grids were fixed from SCREEN_RATES alone.
SCREEN_RATES_ADDED: dict[str, tuple[float, ...]] = {
    arm: (3e-5,)
    for arm in (
        "branchgrpo_official",
        "branchgrpo_binary",
        "branchgrpo_split_noise",
        "branchgrpo_updates",
        "branchgrpo_equal_weight",
    )
}
SCREEN_BASELINES: dict[str, tuple[float, ...]] = {"branchgrpo": (1e-5, 3e-5, 1e-4, 3e-4), "treegrpo": (1e-4, 3e-4)}
"""Today's presets at the same rates and seeds: the sweep runs each arm is paired with."""


def screen_rates() -> dict[str, tuple[float, ...]]:
    """Every screen arm's rates, the added ones included, in ascending order."""
    return {arm: tuple(sorted({*rates, *SCREEN_RATES_ADDED.get(arm, ())})) for arm, rates in SCREEN_RATES.items()}


def screen_jobs() -> list[RunSpec]:
    """The screen's runs in the order to train them: arm by arm (a screen cut short reports whole
    arms), each arm's rates, then its seeds; the added rates after every first one."""
    first = [RunSpec(m, lr, s) for m, rates in SCREEN_RATES.items() for lr in rates for s in SCREEN_SEEDS]
    added = [RunSpec(m, lr, s) for m, rates in SCREEN_RATES_ADDED.items() for lr in rates for s in SCREEN_SEEDS]
    return first + added


# The remedy screen ("A tree that pays", docs/benchmarks.md), fixed before its runs: each remedy arm
# (methods.REMEDIES) and treegrpo itself on two sweep seeds at TreeGRPO's chosen rate and at 3e-4 (its sweep's
# next-best), to the ceilings' 1.2M units with their evaluation spacing. Rate-major: every arm at 1e-4 (with
# treegrpo first, the pair each arm is read against) before any at 3e-4; within a rate, arm by arm in the
# order of methods.REMEDIES (the order the arms landed), so that a screen cut short reports whole arms.
REMEDY_SCREEN = Design(protocol=CEILING.protocol, report_seeds=(), variant_seeds=(), variants=())
REMEDY_SEEDS = (100, 101)
REMEDY_RATES = (1e-4, 3e-4)


def remedy_jobs() -> list[RunSpec]:
    """The remedy screen's runs in the order to train them (see :data:`REMEDY_SCREEN`)."""
    methods = ["treegrpo", *REMEDIES]
    return [RunSpec(m, lr, s) for lr in REMEDY_RATES for m in methods for s in REMEDY_SEEDS]


def ceiling_jobs(reported: RunCache, design: Design = SETTLED) -> list[RunSpec]:
    """The ceiling runs, in :data:`CEILING_ORDER`: each method whose ``design`` runs (in
    ``reported``) the plateau test finds still rising, at the rate its sweep chose there, method
    after method (a cut-short extension reports whole methods). The default design is the one that
    sweeps the official presets too, so that their ceilings are planned like the others'."""
    sweeps = sweeps_of(reported, design)
    out = []
    for method in CEILING_ORDER:
        lr = sweeps[method].chosen if method in sweeps else None
        if lr is None:
            continue
        runs = [r for s in design.report_seeds if (r := reported.load(RunSpec(method, lr, s))) is not None]
        if len(runs) < 2:
            continue
        test = stats.plateau_test([curve(r) for r in runs], design.protocol.budget, design.protocol.evaluations)
        if test["verdict"] == "still rising":
            out += [RunSpec(method, lr, s) for s in CEILING.report_seeds]
    return out


def curve(run: Run) -> list[tuple[float, float]]:
    return [(p["units"], p["reward"]) for p in run.curve]


@dataclass
class Sweep:
    """One method's sweep as far as it has run."""

    method: str
    grids: list[tuple[float, ...]]  # the grid, then each shift of it
    rates: dict[float, list[float | None]]  # rate -> each sweep seed's plateau (None: not run yet)
    chosen: float | None  # None until the final grid is complete

    @property
    def grid(self) -> tuple[float, ...]:
        return self.grids[-1]

    seeds: tuple[int, ...] = SWEEP_SEEDS

    def score(self, lr: float) -> float | None:
        plateaus = self.rates[lr]
        return None if None in plateaus else stats.selection_score(plateaus)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        return {
            "grid": list(self.grid),
            "explored": sorted(self.rates),
            "plateaus": {f"{lr:g}": v for lr, v in sorted(self.rates.items())},
            "scores": {f"{lr:g}": self.score(lr) for lr in sorted(self.rates)},
            "chosen_lr": self.chosen,
            "seeds": list(self.seeds),
        }


COLLAPSE_DROP = 0.1
"""A screen run collapses when its final reward lies more than this below its own best evaluation
(about ten evaluation-noise units)."""


def screen_grid(cache: RunCache, method: str) -> tuple[float, ...] | None:
    """An official preset's grid, fixed before its runs (docs/benchmarks.md): the three rates of the
    1-3-10 series centred on its best screen rate by the sweep's rule over the screen's seeds, or,
    where every screen run collapses (:data:`COLLAPSE_DROP`), on its lowest screen rate; None until
    every screen run of ``method`` is in ``cache``."""
    plateaus, collapsed = {}, []
    for lr in SCREEN_RATES[method]:
        runs = [cache.load(RunSpec(method, lr, s)) for s in SCREEN_SEEDS]
        if None in runs:
            return None
        curves = [curve(r) for r in runs]  # type: ignore[arg-type]
        plateaus[lr] = [stats.plateau(c) for c in curves]
        collapsed += [max(v for _, v in c) - c[-1][1] > COLLAPSE_DROP for c in curves]
    # Amended before any full-protocol run of an official preset: among rates that all collapse the
    # best plateau says how deep, not where the preset is stable, which lies below them.
    if all(collapsed):
        centre = min(plateaus)
    else:
        centre = max(plateaus, key=lambda lr: stats.selection_score(plateaus[lr]))
    return (neighbour(centre, up=False), centre, neighbour(centre, up=True))


def sweep_of(cache: RunCache, method: str, design: Design = FULL) -> Sweep:
    grid = design.grids.get(method) or (screen_grid(cache, method) if method in design.official else None)
    if grid is None:
        return Sweep(method, [()], {}, None, design.sweep_seeds)  # its grid is not known yet
    grids = [grid]
    rates: dict[float, list[float | None]] = {}
    while True:
        for lr in grids[-1]:
            if lr not in rates:
                runs = [cache.load(RunSpec(method, lr, s)) for s in design.sweep_seeds]
                rates[lr] = [None if r is None else stats.plateau(curve(r)) for r in runs]
        sweep = Sweep(method, grids, rates, None, design.sweep_seeds)
        scores = {lr: sweep.score(lr) for lr in grids[-1]}
        if None in scores.values():
            return sweep
        best = max(scores, key=lambda lr: scores[lr])  # type: ignore[arg-type]
        moved = shifted_grid(grids[-1], best) if len(grids[-1]) > 1 else None
        if moved is None:
            sweep.chosen = best
            return sweep
        grids.append(moved)


def targets(sweeps: dict[str, Sweep], headline: tuple[str, ...] = HEADLINE) -> dict[str, Any] | None:
    """The targets fixed from the headline sweeps' seeds (None until every one is complete)."""
    names = [m for m in headline if m in sweeps]
    if any(sweeps[m].chosen is None for m in names):
        return None
    plateaus = {}
    for m in names:
        values = sweeps[m].rates[sweeps[m].chosen]  # type: ignore[index]
        plateaus[m] = statistics.fmean(values)  # type: ignore[arg-type]
    best_flat = max((m for m in FLAT if m in plateaus), key=plateaus.__getitem__)
    return {
        "best_flat": {"method": best_flat, "reward": plateaus[best_flat]},
        "dancegrpo": {"method": "dancegrpo", "reward": plateaus["dancegrpo"]},
        "sweep_plateaus": plateaus,
    }


def sweeps_of(cache: RunCache, design: Design = FULL) -> dict[str, Sweep]:
    return {m: sweep_of(cache, m, design) for m in design.swept}


def jobs(
    cache: RunCache,
    design: Design = FULL,
    *,
    variants: bool = True,
    sweeps: dict[str, Sweep] | None = None,
) -> list[RunSpec]:
    """Every run the protocol needs now, in the order to train them (sweeps first). ``sweeps``, when
    the caller has already built them from ``cache``, saves reading every sweep record again."""
    if sweeps is None:
        sweeps = sweeps_of(cache, design)
    out = [RunSpec(m, lr, s) for m in design.headline for lr in sweeps[m].grid for s in design.sweep_seeds]
    for seed in design.report_seeds:  # seed-major: every method's seed k before seed k + 1
        out += [RunSpec(m, sweeps[m].chosen, seed) for m in design.headline if sweeps[m].chosen is not None]
    if variants:
        # variant-major: a variant is reported once it has its seeds, so when the machine's time runs
        # out the variants trained are complete and the rest are listed as not run, rather than every
        # variant holding a few seeds that no interval can rest on
        for v in design.variants:
            lr = sweeps[VARIANT_OF[v]].chosen
            if lr is not None:
                out += [RunSpec(v, lr, seed) for seed in design.variant_seeds]
    out += [RunSpec(m, lr, s) for m in design.official for lr in sweeps[m].grid for s in design.sweep_seeds]
    for seed in design.report_seeds:
        out += [RunSpec(m, sweeps[m].chosen, seed) for m in design.official if sweeps[m].chosen is not None]
    # the pair's extension: MixGRPO's seeds first (they wait for nothing), then the TreeGRPO's once
    # the rule has chosen it (:func:`extended`)
    for method, seeds in extended(cache, design, sweeps).items():
        if sweeps[method].chosen is not None:
            out += [RunSpec(method, sweeps[method].chosen, s) for s in seeds]
    return out


def settling_tree(cache: RunCache, design: Design, sweeps: dict[str, Sweep]) -> str | None:
    """Which TreeGRPO the extension settles against MixGRPO (docs/benchmarks.md, fixed before the
    runs): ``treegrpo``, unless the design holds ``treegrpo_official`` and its reported seeds end
    above ``treegrpo``'s with a paired Student-t interval above 0; None while that is undecided (the
    official preset's reported runs not all finished)."""
    if "treegrpo_official" not in design.official:
        return "treegrpo"
    lrs = {m: sweeps[m].chosen for m in ("treegrpo", "treegrpo_official")}
    if None in lrs.values():
        return None
    finals = {}
    for m, lr in lrs.items():
        runs = [cache.load(RunSpec(m, lr, s)) for s in design.report_seeds]
        if None in runs:
            return None
        finals[m] = [stats.at(curve(r), design.protocol.budget) for r in runs]  # type: ignore[arg-type]
    t = stats.paired_t(finals["treegrpo_official"], finals["treegrpo"])
    return "treegrpo_official" if t["lo"] > 0 else "treegrpo"


def extended(cache: RunCache, design: Design, sweeps: dict[str, Sweep] | None = None) -> dict[str, tuple[int, ...]]:
    """The extension's seeds of each method it covers: MixGRPO's, and the settling TreeGRPO's once
    :func:`settling_tree` has chosen it."""
    if not design.extension_seeds:
        return {}
    sweeps = sweeps if sweeps is not None else sweeps_of(cache, design)
    tree = settling_tree(cache, design, sweeps)
    return {"mixgrpo": design.extension_seeds, **({tree: design.extension_seeds} if tree else {})}


def seeds_of(method: str, design: Design, extension: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The reported seeds of a swept method, its extension included."""
    return (*design.report_seeds, *extension.get(method, ()))


@dataclass
class Progress:
    """Where a design stands, for ``compare_methods.py --status``."""

    sweeps: dict[str, Sweep]
    done: list[RunSpec]
    pending: list[RunSpec]  # known now: a sweep whose best rate is at an edge adds a rate later
    extending: list[RunSpec]  # the pending runs that go on from a shorter run's checkpoint
    seconds_left: float | None  # on one core, at the finished runs' seconds per unit (None: none finished)
    # not yet known: the reported (and variant) runs of methods whose sweep has still to choose a
    # rate, and their cost priced as if each trained from scratch (an upper bound: some may extend)
    later: int = 0
    seconds_later: float | None = None


def progress(cache: RunCache, design: Design = FULL, *, variants: bool = True) -> Progress:
    """What is trained, what is known to be left, and its cost: each pending run's units still to
    train (the budget, less a shorter run's where it extends one) times its method's seconds per
    unit in the finished runs (all methods' mean for a method with none)."""
    done: list[RunSpec] = []
    rates: dict[str, list[float]] = {}
    for spec, record in cache.finished():
        done.append(spec)
        if record.get("seconds"):
            rates.setdefault(spec.method, []).append(record["seconds"] / record["curve"][-1]["units"])
    sweeps = sweeps_of(cache, design)
    pending = [s for s in jobs(cache, design, variants=variants, sweeps=sweeps) if s not in done]
    every = [r for rs in rates.values() for r in rs]
    starts = {s: cache.start(s) for s in pending}
    unchosen = [m for m in design.swept if sweeps[m].chosen is None]
    later = [m for m in unchosen for _ in design.report_seeds]
    if variants:
        later += [v for v in design.variants if VARIANT_OF[v] in unchosen for _ in design.variant_seeds]
    seconds = seconds_later = None
    if every:

        def per_unit(method: str) -> float:
            return statistics.fmean(rates.get(method, every))

        seconds = sum(
            (design.protocol.budget - (start.run.curve[-1]["units"] if start else 0.0)) * per_unit(spec.method)
            for spec, start in starts.items()
        )
        seconds_later = sum(design.protocol.budget * per_unit(m) for m in later)
    return Progress(sweeps, done, pending, [s for s, st in starts.items() if st], seconds, len(later), seconds_later)
