"""What the documentation states is what the code and the committed outputs say: the concepts page's
Python example runs as written and trains; the failure-mode, results and reward tables (moved from
the README into docs/) quote existing tests, the committed benchmark outputs and the registry."""

from __future__ import annotations

import re
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
COMPARISON = REPO / "benchmarks" / "results" / "shapes_cpu_long"  # the comparison the docs report


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
    benchmarks/results/shapes_cpu_long/results.json (the 540k comparison); the README's sentence is
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
    """The findings written under docs/results.md's tables (the plateau check, TreeGRPO against
    MixGRPO at the budget and over it) are what benchmarks/results/shapes_cpu_long/results.json
    holds: a rerun that moves them must rewrite the prose too."""
    import json

    saved = json.loads((COMPARISON / "results.json").read_text())
    text = " ".join((DOCS / "results.md").read_text().split("<!-- end of generated -->", 1)[1].split())
    flat = saved["flattening"]
    assert flat["method"] == "treegrpo" and not flat["flat"]
    assert "The plateau check fails at 540k." in text
    assert ", ".join(f"{y:.4f}" for y in flat["mean_reward"]) in text
    assert f"evaluation noise of {flat['evaluation_noise']:.4f}" in text
    pair = saved["pairs"]["treegrpo - mixgrpo"]
    final, auc = pair["final"], pair["auc"]
    assert not final["resolved"] and auc["resolved"] and auc["mean"] < 0
    assert f"{final['mean']:+.3f} [{final['lo']:+.3f}, {final['hi']:+.3f}] over 10 paired seeds, not resolved" in text
    assert f"TreeGRPO's by {-auc['mean']:.4f} [{-auc['hi']:.4f}, {-auc['lo']:.4f}]" in text
    for other in ("flowgrpo", "dancegrpo", "branchgrpo"):
        d = saved["pairs"][f"treegrpo - {other}"]["final"]
        assert d["resolved"] and f"({d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}])" in text, other
    mix = saved["methods"]["mixgrpo"]
    assert f"{mix['final']['mean']:.3f}, than its three sweep seeds" in text


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
