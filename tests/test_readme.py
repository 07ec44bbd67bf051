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
