"""benchmarks/budget_pilot.py: the flatness check at every point of a longer budget, on curves whose
answer is worked out by hand, and the refusals of its command line."""

from __future__ import annotations

import budget_pilot
import pytest
from compare.runs import Run


def run(rewards: list[float], se: float = 0.01) -> Run:
    """A run evaluated at 0, 10, 20, ... units with these rewards and evaluation standard error."""
    return Run([], [{"units": 10.0 * i, "reward": r, "reward_se": se} for i, r in enumerate(rewards)])


def test_the_check_finds_where_the_seed_mean_curve_flattens() -> None:
    # two seeds with se 0.01: the seed mean's noise is sqrt(0.01^2) / sqrt(2) = 0.00707, two units 0.0141.
    # seed means at 10..60: 0.20, 0.30, 0.40, 0.45, 0.46, 0.46.
    # at 30: (0.20, 0.30, 0.40), centre 0.30, 0.10 away > 0.0141: not flat; at 40: (0.30, 0.40, 0.45): not;
    # at 50: (0.40, 0.45, 0.46), centre 0.4367, 0.0367 away: not; at 60: (0.45, 0.46, 0.46), centre
    # 0.4567, largest gap 0.0067 <= 0.0141: flat
    a = run([0.10, 0.19, 0.31, 0.39, 0.46, 0.45, 0.47])
    b = run([0.10, 0.21, 0.29, 0.41, 0.44, 0.47, 0.45])
    rows = budget_pilot.checks([a, b], every=10.0, budget=60.0)
    assert [r["budget"] for r in rows] == [30.0, 40.0, 50.0, 60.0]
    assert [r["flat"] for r in rows] == [False, False, False, True]
    assert rows[-1]["mean_reward"] == pytest.approx([0.45, 0.46, 0.46])
    assert rows[-1]["evaluation_noise"] == pytest.approx(0.01 / 2**0.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "nothing", "--budget", "90000"], "--method must be one of"),
        (["--method", "treegrpo", "--budget", "90000", "--seeds", "0"], "are the comparison's reported seeds"),
        (["--method", "treegrpo", "--budget", "50000"], "must be a multiple"),
        (["--method", "treegrpo", "--budget", "60000"], "must be a multiple"),  # 2 points: too few
    ],
)
def test_the_command_line_refuses_what_would_mislead(argv: list[str], message: str, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit):
        budget_pilot.parse([*argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err


def test_an_evaluation_just_past_the_cut_is_interpolated_not_dropped() -> None:
    # evaluations land past their multiple (the iteration that crosses it): units 3, 13, 23, 33, 43, ...
    # seed means 0.40 at 33 and 0.45 at 43: at the cut 40 the curve reads 0.40 + 0.7 x 0.05 = 0.435
    # (dropping the evaluation at 43 would hold 0.40)
    def shifted(rewards: list[float]) -> Run:
        return Run([], [{"units": 10.0 * i + 3, "reward": r, "reward_se": 0.01} for i, r in enumerate(rewards)])

    a = shifted([0.10, 0.19, 0.31, 0.39, 0.46, 0.45, 0.47])
    b = shifted([0.10, 0.21, 0.29, 0.41, 0.44, 0.47, 0.45])
    rows = {r["budget"]: r for r in budget_pilot.checks([a, b], every=10.0, budget=60.0)}
    assert rows[40.0]["mean_reward"][-1] == pytest.approx(0.435)


def test_the_rate_is_the_one_the_comparison_chose_whatever_protocol_its_runs_had(tmp_path, capsys) -> None:
    (tmp_path / "results.json").write_text('{"sweep": {"mixgrpo": {"chosen_lr": 0.0003}}}')
    assert budget_pilot.chosen_rate(tmp_path, "mixgrpo") == 3e-4
    with pytest.raises(SystemExit, match="no chosen rate for flowgrpo: give --lr"):
        budget_pilot.chosen_rate(tmp_path, "flowgrpo")
    with pytest.raises(SystemExit, match="no chosen rate"):
        budget_pilot.chosen_rate(tmp_path / "nothing", "mixgrpo")


def test_the_long_designs_budget_rests_on_the_committed_pilots() -> None:
    """compare/plan.py's LONG budget and docs/benchmarks.md quote the pilots: MixGRPO's two-seed mean
    flat at 480k-540k even at the noise of a ten-seed mean (two units of 0.0019), TreeGRPO's peak at
    360k. A rerun of the pilots that moves these must move the budget's reasoning with it."""
    import json
    from pathlib import Path

    from compare import plan

    root = Path(__file__).resolve().parents[2]
    pilots = root / "benchmarks" / "results" / "shapes_cpu_pilot"
    mix = json.loads((pilots / "pilot_mixgrpo_lr0.0003.json").read_text())
    tree = json.loads((pilots / "pilot_treegrpo_lr0.0003.json").read_text())
    at = {c["budget"]: c for c in mix["checks"]}[plan.LONG.protocol.budget]
    ys = at["mean_reward"]
    centre = sum(ys) / 3
    assert max(abs(y - centre) for y in ys) <= 2 * 0.0019
    assert tree["peak"]["budget"] == 360_000.0 and mix["peak"]["mean_reward"] > tree["peak"]["mean_reward"]
    assert plan.LONG.protocol.every == plan.FIRST.protocol.every  # so the long runs could extend
    docs = (root / "docs" / "benchmarks.md").read_text()
    assert ", ".join(f"{y:.4f}" for y in ys) + " at 480k-540k" in docs
    assert f"peaks at {tree['peak']['mean_reward']:.3f} at 360k" in docs


def test_pilots_of_one_method_at_two_rates_keep_both_files() -> None:
    # the 540k comparison's sweep chose TreeGRPO's 1e-4; its pilot must not replace the one at 3e-4
    assert budget_pilot.pilot_name("treegrpo", 3e-4) == "pilot_treegrpo_lr0.0003.json"
    assert budget_pilot.pilot_name("treegrpo", 1e-4) == "pilot_treegrpo_lr0.0001.json"


def test_the_plateau_designs_budget_rests_on_the_committed_tree_pilot() -> None:
    """compare/plan.py's PLATEAU budget (750k) and docs/benchmarks.md quote the pilot of TreeGRPO at
    the rate the 540k sweep chose: its two-seed mean flat at 690k-750k even at the noise of a
    ten-seed mean, inside MixGRPO's pilot, and before the tree pilot's highest point turns into a
    fall. A rerun of the pilot that moves these must move the budget's reasoning with it."""
    import json
    from pathlib import Path

    from compare import plan

    root = Path(__file__).resolve().parents[2]
    pilots = root / "benchmarks" / "results" / "shapes_cpu_pilot"
    tree = json.loads((pilots / "pilot_treegrpo_lr0.0001.json").read_text())
    mix = json.loads((pilots / "pilot_mixgrpo_lr0.0003.json").read_text())
    chosen = json.loads((root / "benchmarks" / "results" / "shapes_cpu_long" / "results.json").read_text())
    assert tree["lr"] == chosen["sweep"]["treegrpo"]["chosen_lr"] and tree["seeds"] == [100, 101]
    budget = plan.PLATEAU.protocol.budget
    at = {c["budget"]: c for c in tree["checks"]}[budget]
    ten_seed_noise = at["evaluation_noise"] * (len(tree["seeds"]) / 10) ** 0.5
    ys = at["mean_reward"]
    centre = sum(ys) / 3
    assert max(abs(y - centre) for y in ys) <= 2 * ten_seed_noise
    assert max(c["budget"] for c in mix["checks"]) >= budget  # MixGRPO's pilot reaches it
    ends = tree["checks"][-1]["mean_reward"][-1]
    assert tree["peak"]["budget"] < budget and ends < min(ys) - 0.02  # the late fall lies past the budget
    assert plan.PLATEAU.protocol.every == plan.LONG.protocol.every  # so the 540k runs can extend
    docs = (root / "docs" / "benchmarks.md").read_text()
    assert "(" + ", ".join(f"{y:.4f}" for y in ys) + " at 690k-750k)" in docs
    assert f"rises to {tree['peak']['mean_reward']:.3f} at {tree['peak']['budget'] / 1000:.0f}k" in docs
    assert f"({ends:.3f} at 1.08M)" in docs
