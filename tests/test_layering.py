"""The engine stays framework-free, and the package installs the way the design card says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_core_imports_neither_lightning_nor_diffusers() -> None:
    code = (
        "import sys, lit_treegrpo.core as core\n"
        "core.rollout, core.tree_advantages, core.ClippedPolicyLoss, core.prune\n"
        "heavy = sorted(m for m in ('lightning', 'pytorch_lightning', 'diffusers', 'transformers')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    # run from a neutral folder so the installed package, not the checkout, is what gets imported
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO.parent, check=True
    )
    assert result.stdout.strip() == "", f"core pulled in: {result.stdout.strip()}"


def test_core_sources_do_not_mention_the_frameworks() -> None:
    # catches lazy imports inside functions, which the sys.modules check cannot see
    for path in (REPO / "lit_treegrpo" / "core").glob("*.py"):
        text = path.read_text()
        for banned in ("import lightning", "from lightning", "import diffusers", "from diffusers"):
            assert banned not in text, f"{path.name}: {banned}"


def test_callbacks_install_as_a_subpackage() -> None:
    code = "import lit_treegrpo.callbacks as c; print(c.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO.parent, check=True
    )
    assert Path(result.stdout.strip()).parent.name == "callbacks"


def test_importing_the_package_sets_no_warning_filter_and_main_does() -> None:
    # process-wide filters belong to the program's start (cli.main), not to an import
    code = (
        "import warnings, lit_treegrpo.training.module, lit_treegrpo.cli.app as cli\n"
        "ours = lambda: [f for f in warnings.filters if f[1] is not None and 'eval mode at the start' in f[1].pattern]\n"
        "before = len(ours())\n"
        "cli.quiet_known_warnings()\n"
        "print(before, len(ours()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.split() == ["0", "1"]


def _lit_imports(path: Path) -> set[str]:
    """The lit_treegrpo modules ``path`` imports (absolute names; relative ones resolved)."""
    import ast

    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.update(f"{base}.{a.name}" if not node.module else base for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name.startswith("lit_treegrpo")}


def test_the_shapes_world_imports_run_one_way() -> None:
    # world -> (model, reward) -> pretraining: nothing below imports anything above it
    world = _lit_imports(REPO / "lit_treegrpo" / "shapes" / "world.py")
    model = _lit_imports(REPO / "lit_treegrpo" / "models" / "shapes.py")
    reward = _lit_imports(REPO / "lit_treegrpo" / "rewards" / "shapes.py")
    pretrain = _lit_imports(REPO / "lit_treegrpo" / "shapes" / "pretrain.py")
    assert world == set()
    for layer in (model, reward):
        assert "lit_treegrpo.shapes.world" in layer or "lit_treegrpo.shapes" in layer
        assert not any("pretrain" in name for name in layer)
    assert {"lit_treegrpo.models.shapes", "lit_treegrpo.rewards.shapes"} <= pretrain
    assert not _lit_imports(REPO / "lit_treegrpo" / "shapes" / "__init__.py")
    code = "import sys, lit_treegrpo.shapes.world\nprint(sorted(m for m in sys.modules if m.startswith('lit_treegrpo.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "['lit_treegrpo.shapes', 'lit_treegrpo.shapes.world']"
