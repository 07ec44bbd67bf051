"""Choice options are checked against their ``Literal``: the choices are read from the type, and no
run-time check types a choice list again (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Literal

import pytest

from lit_treegrpo.core.choices import check_choice, choices

REPO = Path(__file__).resolve().parents[2]
Inner = Literal["a", "b"]


def test_choices_read_the_literal_in_order_and_flatten_nested_ones() -> None:
    assert choices(Literal["x", "y", "z"]) == ("x", "y", "z")
    assert choices(Literal[Inner, "c"]) == ("a", "b", "c")
    with pytest.raises(TypeError, match="not a Literal"):
        choices(int)


def test_check_choice_is_one_line_naming_the_option_and_listing_the_choices() -> None:
    check_choice("opt", "b", Inner)
    with pytest.raises(ValueError, match=r"^opt must be 'a' or 'b', got 'c'$"):
        check_choice("opt", "c", Inner)
    with pytest.raises(ValueError, match=r"^opt must be 'a', 'b' or 'c', got 'd'$"):
        check_choice("opt", "d", Literal[Inner, "c"])


def _string_collection(node: ast.AST) -> frozenset[str] | None:
    if not isinstance(node, (ast.Tuple, ast.Set, ast.List)) or len(node.elts) < 2:
        return None
    if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return frozenset(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def test_no_runtime_check_retypes_a_literal_choice_list() -> None:
    sources = [*(REPO / "lit_treegrpo").rglob("*.py"), *(REPO / "callbacks").rglob("*.py")]
    trees = {path: ast.parse(path.read_text()) for path in sources}
    literals: set[frozenset[str]] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
                values = _string_collection(node.slice)
                if values:
                    literals.add(values)
    assert frozenset({"flow_sde", "dance_sde", "cps"}) in literals  # the scan sees the package's Literals
    retyped = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                for side in node.comparators:
                    if _string_collection(side) in literals:
                        retyped.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.Assign) and _string_collection(node.value) in literals:
                retyped.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not retyped, f"choice lists typed again instead of read from their Literal: {retyped}"
