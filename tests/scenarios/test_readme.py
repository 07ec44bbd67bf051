"""What the documentation states is what the code and the committed outputs say: the concepts page's
Python example runs as written and trains; the failure-mode, results and reward tables (moved from
the README into docs/) quote existing tests, the committed benchmark outputs and the registry."""

from __future__ import annotations

import re
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
COMPARISON = REPO / "benchmarks" / "results" / "shapes_cpu_750k"  # the comparison the docs report


def ci(d: dict, digits: int = 3, sign: str = "+") -> str:
    """A mean and its interval as the results' prose prints them: "+0.010 [+0.003, +0.018]"."""
    return f"{d['mean']:{sign}.{digits}f} [{d['lo']:{sign}.{digits}f}, {d['hi']:{sign}.{digits}f}]"


def test_the_concepts_python_example_runs() -> None:
    page = DOCS / "concepts.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 1, "expected one python example in docs/concepts.md"
    torch.manual_seed(0)
    initial = torch.nn.Conv2d(4, 4, 3, padding=1).weight.detach().clone()
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(blocks[0], str(page), "exec"), namespace)
    tree, keep, velocity = namespace["tree"], namespace["keep"], namespace["velocity"]
    assert tree.num_leaves == 54 and tree.nfe == 404
    assert 0 < int(keep.sum()) < tree.num_edges
    assert not torch.equal(velocity.weight, initial), "the example's training loop changed nothing"
    assert torch.isfinite(namespace["out"].loss)


def test_every_row_of_what_happens_when_names_tests_that_exist() -> None:
    section = (DOCS / "failure_modes.md").read_text()
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what goes wrong")]
    assert len(rows) >= 30, len(rows)
    tests_dir = REPO / "tests"
    for row in rows:
        cell = row.rstrip(" |").rsplit(" | ", 1)[1]  # the last column
        refs = re.findall(r"`([^`]*::[^`]+)`", cell)
        assert refs or cell == "same", row  # "same": the test of the row above
        current = None
        for ref in refs:
            path, name = ref.split("::", 1)
            current = path or current  # "::name" continues the file named before it
            assert current, row
            source = (tests_dir / current).read_text()
            assert f"def {name.split('[')[0]}(" in source, f"{current}::{name} does not exist"


def test_the_results_and_the_readme_quote_the_committed_comparison() -> None:
    """docs/results.md's generated region is report.md, which is the tables formatted from
    benchmarks/results/shapes_cpu_750k/results.json (the 750k comparison); the README's sentence is
    its headline (so a rerun that changes them must regenerate both: compare_methods.py --report
    --docs)."""
    import json
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from compare import report

    out = COMPARISON
    saved = json.loads((out / "results.json").read_text())
    import compare_methods

    # a comparison still under way is committed as it stands (its tables say what is missing)
    assert saved["protocol"]["budget_axis"] == "compute"
    tables = report.tables(saved)
    assert (out / "report.md").read_text() == tables + "\n"
    plots = compare_methods.plot_links(saved, out, DOCS / "results.md")
    assert report.generated_region((DOCS / "results.md").read_text()) == tables + plots
    assert report.generated_region((REPO / "README.md").read_text()) == saved["headline"]


def test_the_results_prose_quotes_the_committed_comparison() -> None:
    """The findings written under docs/results.md's tables (the plateau check, TreeGRPO against each
    headline method at the budget and over it, the times to target, the variants, the timing) are
    what benchmarks/results/shapes_cpu_750k/results.json holds, verdicts included: a rerun that
    moves them must rewrite the prose too."""
    import json
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from compare import settle, stats

    saved = json.loads((COMPARISON / "results.json").read_text())
    text = " ".join((DOCS / "results.md").read_text().split("<!-- end of generated -->", 1)[1].split())

    def times(d: dict) -> str:
        return f"{d['mean']:.2f}x [{d['lo']:.2f}x, {d['hi']:.2f}x]"

    flat = saved["flattening"]
    # every headline method has its ten reported seeds, TreeGRPO and MixGRPO the extension's 26
    headline = ("treegrpo", "mixgrpo", "dancegrpo", "flowgrpo", "branchgrpo")
    assert saved["complete"] and [saved["methods"][m]["n"] for m in headline] == [26, 26, 10, 10, 10]
    assert flat["method"] == "treegrpo" and flat["flat"]
    assert "The plateau check passes at 750k." in text
    assert ", ".join(f"{y:.4f}" for y in flat["mean_reward"]) in text
    assert f"evaluation noise of {flat['evaluation_noise']:.4f}" in text
    methods = saved["methods"]
    # the pre-registered pair: t (the verdict) and bootstrap intervals, Holm, seeds ahead, what it is made of
    pair = saved["pairs"]["treegrpo - mixgrpo"]
    t, boot = pair["final_t"], pair["final"]
    assert len(pair["seeds"]) == 26 and t["holm"] and t["lo"] > 0 and boot["resolved"]
    assert (
        f"TreeGRPO ends above MixGRPO, over 26 paired seeds: {ci(t, 4)} (paired t, p = {t['p']:.4f}, resolved "
        f"after Holm's correction over the ten pairs; bootstrap {ci(boot, 4)})" in text
    )
    ahead = sum(a > b for a, b in zip(methods["treegrpo"]["final_per_seed"], methods["mixgrpo"]["final_per_seed"]))
    assert f"TreeGRPO is ahead on {ahead} of the 26 seeds" in text
    first_ten = stats.paired_t(methods["treegrpo"]["final_per_seed"][:10], methods["mixgrpo"]["final_per_seed"][:10])
    assert first_ten["lo"] < 0 < first_ten["hi"] and f"at its first ten seeds the pair was {ci(first_ten, 4)}" in text
    assert f"about {100 * t['mean'] / methods['mixgrpo']['final']['mean']:.1f}% of the reward" in text
    assert f"({ci(methods['treegrpo']['final'], sign='')} against {ci(methods['mixgrpo']['final'], sign='')})" in text
    assert f"best evaluations are level ({ci(methods['treegrpo']['peak'], sign='')} and " in text
    assert f"{ci(methods['mixgrpo']['peak'], sign='')})" in text
    assert (
        f"MixGRPO gives back {ci(methods['mixgrpo']['drop'], sign='')} and TreeGRPO "
        f"{ci(methods['treegrpo']['drop'], sign='')}" in text
    )
    ceilings = [methods[m]["ceiling"] for m in ("treegrpo", "mixgrpo")]
    assert all(c["verdict"] == "plateau" and c["budget"] == 750_000 for c in ceilings)
    assert f"750k plateaus, {ci(ceilings[0]['reward'], sign='')} and {ci(ceilings[1]['reward'], sign='')}" in text
    # a finished ceiling is quoted with its cap's slope; one still under way is not read at all
    dance, flow = methods["dancegrpo"]["ceiling"], methods["flowgrpo"]["ceiling"]
    assert all(c["verdict"] == "above at the cap" and c["n"] == c["planned"] == 5 for c in (dance, flow))
    assert (
        f"ends above {ci(dance['reward'], sign='')} at the {dance['budget'] / 1e6:.1f}M cap and is still rising "
        f"there ({ci(dance['slope'], 4)} per 100k units)" in text
    )
    assert f"above {ci(flow['reward'], sign='')} at the cap and still rising there ({ci(flow['slope'], 4)})" in text
    branch_cap = methods["branchgrpo"]["ceiling"]
    assert branch_cap["verdict"] == "above at the cap" and branch_cap["n"] == 5
    assert branch_cap["reward"]["hi"] < ceilings[0]["reward"]["lo"]  # "still below where TreeGRPO stays"
    assert (
        f"above {ci(branch_cap['reward'], sign='')} at the cap and still rising there ({ci(branch_cap['slope'], 4)})"
        in text
    )
    # Flow-GRPO's interval at its cap lies wholly above TreeGRPO's plateau's, at 1.6x its compute
    assert flow["reward"]["lo"] > ceilings[0]["reward"]["hi"] and flow["budget"] / ceilings[0]["budget"] == 1.6
    assert f"TreeGRPO's flat curve stays, {ci(ceilings[0]['reward'], sign='')}:" in text
    # the README's line on the ceilings: of every method run to the cap, only Flow-GRPO's interval
    # there lies above TreeGRPO's plateau
    capped = {m: c["ceiling"] for m, c in methods.items() if c.get("ceiling", {}).get("budget") == 1_200_000}
    assert len(capped) == 5 and all(c["n"] == 5 for c in capped.values())
    assert [m for m, c in capped.items() if c["reward"]["lo"] > ceilings[0]["reward"]["hi"]] == ["flowgrpo"]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "At 1.2M units only Flow-GRPO ends above TreeGRPO's 750k plateau" in readme
    sooner = [
        saved["level_targets"][k]["speedups"]["treegrpo vs flowgrpo"]["compute"] for k in ("0.75", "0.775", "0.79")
    ]
    assert all(x["holm"] and x["lo"] > 1 for x in sooner)
    assert (
        f"needs {sooner[0]['mean']:.2f}x, {sooner[1]['mean']:.2f}x and {sooner[2]['mean']:.2f}x its compute to 0.75"
        in text
    )
    seconds = saved["seconds"]["pairs"]["treegrpo - mixgrpo"]["final"]
    assert seconds["resolved"] and f"At equal seconds the lead holds: {ci(seconds, 4)} (resolved)" in text
    final = {o: saved["pairs"][f"treegrpo - {o}"]["final"] for o in ("flowgrpo", "dancegrpo", "branchgrpo")}
    assert not final["flowgrpo"]["resolved"] and len(saved["pairs"]["treegrpo - flowgrpo"]["seeds"]) == 10
    flow_seconds = saved["seconds"]["pairs"]["treegrpo - flowgrpo"]["final"]
    assert flow_seconds["resolved"]
    assert (
        f"{ci(final['flowgrpo'])} over 10 paired seeds, not resolved (in seconds {ci(flow_seconds, 4)}, resolved)"
        in text
    )
    for other in ("dancegrpo", "branchgrpo"):
        assert final[other]["resolved"] and f"({ci(final[other])}, resolved)" in text, other
    mix_flow = saved["pairs"]["mixgrpo - flowgrpo"]["final"]
    assert not mix_flow["resolved"] and f"({ci(mix_flow)}, not resolved)" in text
    # over the budget: the AUC, where each leads along the curve, the crossing, the fixed levels
    auc = pair["auc"]
    assert auc["resolved"] and auc["hi"] < 0 and f"MixGRPO's is {ci(auc, 4)}, resolved" in text
    auc_ten = stats.paired_difference(methods["treegrpo"]["auc_per_seed"][:10], methods["mixgrpo"]["auc_per_seed"][:10])
    assert not auc_ten["resolved"] and f"(at ten seeds {ci(auc_ten, 4)}, not resolved)" in text
    (lead_mix, *_), lead_tree = settle.leads(saved["curve_pair"]), settle.leads(saved["curve_pair"])[-1]
    assert lead_mix[0] == "mixgrpo" and lead_tree[0] == "treegrpo" and lead_tree[2] == 750_000
    cross = saved["curve_pair"]
    assert (
        f"MixGRPO leads (the paired t interval excludes 0) from {lead_mix[1] / 1000:.0f}k to {lead_mix[2] / 1000:.0f}k "
        f"units; the mean curves cross at {cross['crossing'] / 1000:.0f}k units [{cross['crossing_lo'] / 1000:.0f}k, "
        f"{cross['crossing_hi'] / 1000:.0f}k], and TreeGRPO leads from {lead_tree[1] / 1000:.0f}k to the budget" in text
    )
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        f"TreeGRPO's mean reward over the budget (AUC) minus MixGRPO's is {ci(auc)} (resolved), and the curves "
        f"cross at {cross['crossing'] / 1000:.0f}k units" in readme
    )
    at = {m: methods[m]["at_units"] for m in ("treegrpo", "mixgrpo")}
    assert f"({at['mixgrpo']['187500']['mean']:.3f} against {at['treegrpo']['187500']['mean']:.3f} at 187.5k" in text
    assert (
        f"({at['mixgrpo']['375000']['mean']:.3f} at 375k, {at['mixgrpo']['562500']['mean']:.3f} at 562.5k, "
        f"{at['mixgrpo']['750000']['mean']:.3f} at 750k); TreeGRPO climbs slower "
        f"({at['treegrpo']['375000']['mean']:.3f} at 375k, {at['treegrpo']['562500']['mean']:.3f} at 562.5k)" in text
    )
    level = {k: saved["level_targets"][k]["speedups"]["treegrpo vs mixgrpo"] for k in ("0.75", "0.775", "0.79")}
    assert level["0.75"]["compute"]["holm"] and level["0.75"]["compute"]["hi"] < 1
    assert f"speed-up {times(level['0.75']['compute'])}, resolved after Holm" in text
    assert not level["0.775"]["compute"]["holm"] and not level["0.79"]["compute"]["holm"]
    assert f"({times(level['0.775']['compute'])} and {times(level['0.79']['compute'])})" in text
    slower = [level[k]["seconds"] for k in ("0.75", "0.775", "0.79")]
    assert all(x["hi"] < 1 for x in slower)
    assert f"{times(slower[0])}, {times(slower[1])} and {times(slower[2])}" in text
    auc = saved["pairs"]["treegrpo - flowgrpo"]["auc"]
    assert auc["resolved"] and f"Flow-GRPO's ({ci(auc, 4)})" in text
    dance = {m: methods[m]["compute_to_target"]["dancegrpo"] for m in ("treegrpo", "mixgrpo", "flowgrpo")}
    assert (
        f"TreeGRPO is {times(dance['treegrpo']['speedup'])} faster than DanceGRPO in compute, MixGRPO "
        f"{times(dance['mixgrpo']['speedup'])} and Flow-GRPO {times(dance['flowgrpo']['speedup'])}" in text
    )
    assert not any(methods["branchgrpo"]["compute_to_target"]["dancegrpo"]["reached"])
    best = {m: methods[m]["compute_to_target"]["best_flat"] for m in ("treegrpo", "mixgrpo")}
    speedup = best["treegrpo"]["speedup"]
    assert speedup["lo"] < 1 < speedup["hi"] and f"a speed-up of {times(speedup)}, not resolved" in text
    assert (
        f"reached by {sum(best['treegrpo']['reached'])} of 26 seeds of TreeGRPO and "
        f"{sum(best['mixgrpo']['reached'])} of 26 of MixGRPO" in text
    )
    assert f"MixGRPO's reported seeds end at {methods['mixgrpo']['final']['mean']:.3f}" in text
    branch = methods["branchgrpo"]["at_units"]
    assert f"{branch['562500']['mean']:.3f} at 562.5k units, {branch['750000']['mean']:.3f} at 750k" in text
    ms = {m: 1000 * t["seconds_per_unit"] for m, t in saved["timing"]["methods"].items()}
    assert f"a unit of TreeGRPO costs {ms['treegrpo']:.3f} ms and one of MixGRPO {ms['mixgrpo']:.3f} ms" in text
    for key, pair in saved["variant_pairs"].items():
        variant = key.split(" - ")[0]
        verdict = "resolved" if pair["final"]["resolved"] else "not resolved"
        assert (
            f"`{variant}` ({len(pair['seeds'])} seeds) minus its headline method: {ci(pair['final'])}, {verdict}"
            in text
        )
    # BranchGRPO-Mix: its gain over BranchGRPO over the budget, its end, and its paper's claim on each axis
    pair, mix = saved["variant_pairs"]["branchgrpo_mix - branchgrpo"], methods["branchgrpo_mix"]
    assert f"(AUC {ci(pair['auc'])}, resolved;" in text and f"ends at {mix['final']['mean']:.3f}" in text
    slope = mix["plateau"]
    assert slope["verdict"] == "still rising"
    assert f"(slope over the last third {slope['slope']:+.3f} [{slope['lo']:+.3f}, {slope['hi']:+.3f}]" in text
    claim = {c["axis"]: c["ours"] for c in saved["claims"] if c["method"] == "branchgrpo_mix"}
    assert f"takes {times(claim['seconds per iteration'])} less time than DanceGRPO's" in text
    assert f"({claim['compute']['mean']:.2f}x in compute, {claim['seconds']['mean']:.2f}x in seconds)" in text
    for missing in saved["missing"]:
        assert missing.split(":")[0] + "`" in text, missing


def test_the_results_quote_the_committed_step_noise_table() -> None:
    """docs/results.md: the per-step noise diagnostic is the table the benchmark wrote
    (benchmarks/results/step_noise/step_noise.md)."""
    section = (DOCS / "results.md").read_text()
    table = REPO / "benchmarks" / "results" / "step_noise" / "step_noise.md"
    rows = [line for line in table.read_text().splitlines() if line.startswith("| ")]
    assert rows
    for row in rows:
        assert row in section, f"{table.name}: {row}"


def test_the_reward_table_and_the_modules_help_name_every_registered_reward() -> None:
    # one registry (rewards.REWARDS); what users read about it is checked against it
    from lit_treegrpo.rewards import REWARDS
    from lit_treegrpo.training.module import TreeGRPOModule

    section = (DOCS / "rewards.md").read_text()
    table = {
        name
        for row in section.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    assert table == set(REWARDS), table ^ set(REWARDS)
    help_text = TreeGRPOModule.__doc__.split("reward:", 1)[1].split("tree:", 1)[0]
    assert set(re.findall(r"``(\w+)``", help_text)) == set(REWARDS)


def test_the_fidelity_verdict_quotes_the_committed_comparison() -> None:
    """The answer to "which ingredient closes BranchGRPO's gap" and the official TreeGRPO's reading,
    as docs/results.md's prose states them, are what results.json holds at ten paired seeds."""
    import json
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from compare import stats

    saved = json.loads((COMPARISON / "results.json").read_text())
    text = " ".join((DOCS / "results.md").read_text().split("<!-- end of generated -->", 1)[1].split())

    def k(d: dict) -> str:
        return f"{d['mean'] / 1000:+.1f}k [{d['lo'] / 1000:+.1f}k, {d['hi'] / 1000:+.1f}k]"

    official = saved["official_pairs"]
    assert all(len(pair["seeds"]) == 10 for pair in official.values())
    claims = {(c["method"], c["axis"]): c for c in saved["claims"]}
    assert claims[("branchgrpo", "compute")]["verdict"] == "contradicted"
    assert f"Today's `branchgrpo` ends {ci(claims[('branchgrpo', 'compute')]['ours'])} against DanceGRPO" in text
    base, dance = official["branchgrpo_official - branchgrpo"], official["branchgrpo_official - dancegrpo"]
    peak, units = base["quantities"]["peak"]["t"], base["quantities"]["units_to_target"]["t"]
    assert base["final"]["resolved"] and peak["lo"] > 0 and units["hi"] < 0
    assert f"ends {ci(base['final'])} above today's preset (resolved; its peak {ci(peak)} higher" in text
    assert f"its compute to DanceGRPO's target {k(units)} units" in text
    assert not dance["final"]["resolved"] and f"and {ci(dance['final'])} against DanceGRPO, not resolved" in text
    assert dance["auc"]["resolved"] and f"DanceGRPO's, {ci(dance['auc'], 4)} (resolved)" in text
    assert saved["methods"]["branchgrpo_official"]["plateau"]["verdict"] == "still rising"
    # its ceiling beside DanceGRPO's: both still rising at the cap, intervals overlapping ("still level"),
    # and not wholly above TreeGRPO's 750k plateau
    cap, dance_cap = saved["methods"]["branchgrpo_official"]["ceiling"], saved["methods"]["dancegrpo"]["ceiling"]
    assert all(c["verdict"] == "above at the cap" and c["n"] == c["planned"] == 5 for c in (cap, dance_cap))
    assert cap["reward"]["lo"] < dance_cap["reward"]["hi"] and dance_cap["reward"]["lo"] < cap["reward"]["hi"]
    assert cap["reward"]["lo"] < saved["methods"]["treegrpo"]["ceiling"]["reward"]["hi"]
    assert (
        f"`branchgrpo_official` ends above {ci(cap['reward'], sign='')} (slope there {ci(cap['slope'], 4)} per "
        f"100k units), DanceGRPO above {ci(dance_cap['reward'], sign='')}. The two intervals overlap" in text
    )
    # the screen's reading: binary splits alone reach DanceGRPO's plateau on both seeds at 3e-5
    arms = saved["screen"]["arms"]
    binary = arms["branchgrpo_binary"]["rates"]["3e-05"]["final"]["arm_per_seed"]
    target = saved["screen"]["target"]
    assert all(f >= target for f in binary) and f"on both seeds at 3e-5 ({binary[0]:.3f} and {binary[1]:.3f})" in text
    noise_peak = arms["branchgrpo_split_noise"]["pooled"]["peak"]["t"]
    assert noise_peak["hi"] < 0 and f"lowers the peak (over its rates {ci(noise_peak)}, resolved)" in text
    # TreeGRPO's official settings
    tree, tree_dance = official["treegrpo_official - treegrpo"], official["treegrpo_official - dancegrpo"]
    assert tree["final"]["hi"] < 0 and tree_dance["final"]["hi"] < 0
    assert f"ends {ci(tree['final'])} below `treegrpo` and {ci(tree_dance['final'])} below DanceGRPO" in text
    speed = claims[("treegrpo_official", "compute")]
    assert speed["verdict"] == "contradicted" and speed["ours"]["censored"]["method"] == 10
    assert f"{speed['ours']['mean']:.2f}x [{speed['ours']['lo']:.2f}x, {speed['ours']['hi']:.2f}x] against" in text
    slope = saved["methods"]["treegrpo_official"]["plateau"]
    assert slope["verdict"] == "still rising" and f"({slope['slope']:+.4f} [{slope['lo']:+.4f}," in text
    # its ceiling: flat at the cap by the slope test (interval below the tolerance's reach, estimate above
    # it), all five seeds, and below DanceGRPO's 750k final
    cap = saved["methods"]["treegrpo_official"]["ceiling"]
    assert cap["verdict"] == "plateau" and cap["n"] == cap["planned"] == 5 and cap["budget"] == 1_200_000
    assert cap["slope"]["lo"] < stats.SLOPE_TOLERANCE < cap["slope"]["mean"]
    assert f"({ci(cap['slope'], 4)} per 100k units there:" in text
    assert f"its last three evaluations, {ci(cap['reward'], sign='')}." in text
    dance_final = saved["methods"]["dancegrpo"]["final"]
    assert cap["reward"]["hi"] < dance_final["lo"] and f"750k final, {ci(dance_final, sign='')}, with 1.6x" in text
