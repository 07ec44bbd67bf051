"""The engine stays framework-free and machine-independent, the folders import one way with no
cycle (lazy imports included), and the package installs the way the design card says."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_core_imports_neither_lightning_nor_diffusers() -> None:
    code = (
        "import sys, lit_treegrpo.core as core\n"
        "core.rollout, core.tree_advantages, core.ClippedPolicyLoss, core.prune\n"
        "heavy = sorted(m for m in ('lightning', 'pytorch_lightning', 'diffusers', 'transformers', 'peft')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    # run from a neutral folder so the installed package, not the checkout, is what gets imported
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO.parent, check=True)
    assert result.stdout.strip() == "", f"core pulled in: {result.stdout.strip()}"


def test_core_sources_do_not_mention_the_frameworks() -> None:
    # catches lazy imports inside functions, which the sys.modules check cannot see
    for path in (REPO / "lit_treegrpo" / "core").glob("*.py"):
        text = path.read_text()
        for banned in (
            "import lightning",
            "from lightning",
            "import diffusers",
            "from diffusers",
            "import transformers",
            "from transformers",
            "import peft",
            "from peft",
        ):
            assert banned not in text, f"{path.name}: {banned}"


def test_callbacks_install_as_a_subpackage() -> None:
    code = "import lit_treegrpo.callbacks as c; print(c.__file__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO.parent, check=True)
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


def test_the_shapes_testbed_is_one_folder_whose_imports_run_one_way() -> None:
    # world -> (model, reward) -> pretraining, all in shapes/; models/ and rewards/ import none of it
    folder = REPO / "lit_treegrpo" / "shapes"
    world = _lit_imports(folder / "world.py")
    model, reward, pretrain = (_lit_imports(folder / f"{name}.py") for name in ("model", "reward", "pretrain"))
    assert world == set()
    for layer in (model, reward):
        assert "lit_treegrpo.shapes" in layer or "lit_treegrpo.shapes.world" in layer
        assert not any("pretrain" in name for name in layer)
    assert {"lit_treegrpo.shapes.model", "lit_treegrpo.shapes.reward"} <= pretrain
    assert not _lit_imports(folder / "__init__.py")
    for path in [*(REPO / "lit_treegrpo" / "models").glob("*.py"), *(REPO / "lit_treegrpo" / "rewards").glob("*.py")]:
        assert not any(name.startswith("lit_treegrpo.shapes") for name in _lit_imports(path)), path
    code = (
        "import sys, lit_treegrpo.shapes.world\nprint(sorted(m for m in sys.modules if m.startswith('lit_treegrpo.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "['lit_treegrpo.shapes', 'lit_treegrpo.shapes.world']"


# ------------------------------------------------------------------------ the package's import graph
#: What each folder may import of the package (its ``__init__`` docstring says the same); the
#: command line, at the top, may import everything, and nothing imports it.
ALLOWED = {
    "common": set(),
    "core": set(),
    "models": {"core", "common"},
    "rewards": {"core", "common", "models"},  # models: the tiny offline tokenizer of the tests' rewards
    "shapes": {"core", "common", "models", "rewards"},  # the Shapes model and reward on their base classes
    "data": {"common"},
    "training": {"core", "common", "models", "rewards", "data"},
    "artifacts": {"common", "models"},  # models: the export's formats
    "callbacks": {"core", "common", "artifacts"},  # artifacts: ExportOnTrainEnd writes what the export command writes
    "cli": {"core", "common", "models", "rewards", "data", "training", "artifacts", "callbacks"},
}
#: modules below the command line that are command lines themselves (``python -m``), and what more they may import:
#: the Shapes pre-training uses the main CLI's one-line errors and checks and the artifacts' folder lock
COMMAND_LINES = {
    "lit_treegrpo.shapes.pretrain": {"cli", "artifacts"},
    "lit_treegrpo.shapes.pretrain_rules": {"cli", "artifacts", "training"},  # training: the work estimate's bounds
}
#: imports the engine may not make: the frameworks above it, and the environment (it computes from
#: its arguments alone, the same on every machine)
CORE_BANNED_IMPORTS = {
    "lightning",
    "pytorch_lightning",
    "diffusers",
    "transformers",
    "peft",
    "huggingface_hub",
    "os",
    "sys",
    "platform",
    "psutil",
    "socket",
    "subprocess",
    "shutil",
    "multiprocessing",
}
CORE_BANNED_ATTRIBUTES = ("torch.cuda", "torch.backends", "torch.mps", "torch.xpu", "torch.distributed", "os.environ")


def _package_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name: lit_treegrpo/, and callbacks/ under the name
    it installs as (``lit_treegrpo.callbacks``)."""
    found = {}
    for root, package in ((REPO / "lit_treegrpo", "lit_treegrpo"), (REPO / "callbacks", "lit_treegrpo.callbacks")):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return found


def _imported(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The package modules that module ``name`` (file ``path``) imports anywhere: at module level or
    inside a function (a lazy import is an import), relative or absolute. ``from X import Y`` names
    the module ``X.Y`` when there is one, else ``X``."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known, found = set(modules), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return found & known


def _import_graph() -> dict[str, set[str]]:
    modules = _package_modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of ``graph`` that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:
        start = min(component)
        path, seen = [start], {start}
        while True:  # walk inside the component until a node repeats
            nxt = min(n for n in graph[path[-1]] if n in component)
            if nxt in seen:
                cycles.append([*path[path.index(nxt) :], nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return cycles


def test_the_cycle_finder_finds_a_cycle_and_names_its_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_lazy_and_relative_imports() -> None:
    graph = _import_graph()
    # relative, at module level; and the package's __init__ re-exporting a submodule
    assert "lit_treegrpo.training.faults" in graph["lit_treegrpo.training.module"]
    assert "lit_treegrpo.callbacks.ema" in graph["lit_treegrpo.callbacks"]
    # inside a function (the export's format check), and absolute from callbacks/
    assert "lit_treegrpo.models.shapes" in graph["lit_treegrpo.artifacts.export"]
    assert "lit_treegrpo.artifacts.export" in graph["lit_treegrpo.callbacks.export"]


def test_the_package_has_no_import_cycle_lazy_or_not() -> None:
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_each_folder_imports_only_the_folders_below_it() -> None:
    problems = []
    for name, imports in _import_graph().items():
        folder = name.split(".")[1] if name.count(".") >= 1 else None
        if folder not in ALLOWED:  # the package's own __init__ / __main__
            continue
        for target in sorted(imports):
            other = target.split(".")[1] if target.count(".") >= 1 else "lit_treegrpo"
            if other != folder and other not in ALLOWED[folder] | COMMAND_LINES.get(name, set()):
                problems.append(f"{name} imports {target}")
    assert not problems, problems


def test_every_folder_is_a_package_that_installs_and_says_what_it_may_import() -> None:
    import ast
    import re

    listed = re.search(r"^packages = \[(.*?)\]", (REPO / "pyproject.toml").read_text(), flags=re.M | re.S)
    packages = set(re.findall(r'"([\w.]+)"', listed.group(1)))
    # the shipped configs install as data folders (no module): `--config shapes` from a wheel
    data = {"lit_treegrpo.configs", "lit_treegrpo.configs.methods"}
    assert data <= packages and not list((REPO / "configs").rglob("*.py"))
    packages -= data
    folders = {f"lit_treegrpo.{p.parent.name}" for p in (REPO / "lit_treegrpo").glob("*/__init__.py")}
    assert packages == {"lit_treegrpo", "lit_treegrpo.callbacks", *folders}, (
        "pyproject's packages and the folders differ"
    )
    assert set(ALLOWED) == {name.rpartition(".")[2] for name in packages - {"lit_treegrpo"}}
    # the top level holds the folders only (and the package's own __init__ / __main__)
    assert sorted(p.name for p in (REPO / "lit_treegrpo").glob("*.py")) == ["__init__.py", "__main__.py"]
    for name in sorted(packages - {"lit_treegrpo"}):
        init = REPO / ("callbacks" if name.endswith(".callbacks") else name.replace(".", "/")) / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, (
            f"{init.relative_to(REPO)}: its docstring says what lives there, and what it may import"
        )


def test_no_module_is_longer_than_450_lines() -> None:
    long = {
        str(p.relative_to(REPO)): n for p in _package_modules().values() if (n := len(p.read_text().splitlines())) > 450
    }
    assert not long, f"split these modules: {long}"


def test_core_neither_imports_the_frameworks_nor_probes_the_environment() -> None:
    import ast

    def banned(dotted: str) -> bool:
        return (
            dotted.split(".")[0] in CORE_BANNED_IMPORTS
            or dotted.startswith(tuple(f"{a}." for a in CORE_BANNED_ATTRIBUTES))
            or dotted in CORE_BANNED_ATTRIBUTES
        )

    problems = set()
    for path in sorted((REPO / "lit_treegrpo" / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                problems |= {f"{where}: import {a.name}" for a in node.names if banned(a.name)}
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                problems |= {f"{where}: from {node.module} import ..." for n in names if banned(n)}
            elif isinstance(node, ast.Attribute) and ast.unparse(node) in CORE_BANNED_ATTRIBUTES:
                problems.add(f"{where}: {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(("/proc", "/sys/"))
            ):
                problems.add(f"{where}: reads {node.value}")
            elif isinstance(node, (ast.Name, ast.Attribute)) and getattr(node, "id", getattr(node, "attr", "")) in (
                "getenv",
                "environ",
            ):
                problems.add(f"{where}: {ast.unparse(node)}")
    assert not problems, sorted(problems)
