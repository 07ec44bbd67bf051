"""The README's Python example runs as written and trains."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "expected one python example in the README"
    torch.manual_seed(0)
    initial = torch.nn.Conv2d(4, 4, 3, padding=1).weight.detach().clone()
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    tree, keep, velocity = namespace["tree"], namespace["keep"], namespace["velocity"]
    assert tree.num_leaves == 54 and tree.nfe == 404
    assert 0 < int(keep.sum()) < tree.num_edges
    assert not torch.equal(velocity.weight, initial), "the example's training loop changed nothing"
    assert torch.isfinite(namespace["out"].loss)


def test_every_row_of_what_happens_when_names_tests_that_exist() -> None:
    text = README.read_text()
    section = text.split("### What happens when...", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what goes wrong")]
    assert len(rows) >= 30, len(rows)
    tests_dir = README.parent / "tests"
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
