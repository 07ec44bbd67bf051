"""The documentation holds together: the README links every page of docs/, every relative link of
README.md and docs/*.md reaches an existing file (and heading), no source file cites a Markdown file
the repository lacks, and the examples of docs/extending.md run as written.

docs/extending.md marks its fenced blocks with a tag after the language: ``python my_extensions.py``
and ``python train.py`` blocks are (concatenated into) those files, ``yaml my_method.yaml`` is that
config file, ``python run`` blocks are executed in order in one namespace, and every ``bash`` line
that starts a training command is built through the command line (and, in the slow test, run in
its own process for one training step).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
EXTENDING = DOCS / "extending.md"
TEST_COMMAND = "HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python -m pytest -q -n 2"
MAIN_JOB = "python -m lit_treegrpo fit --config configs/shapes.yaml"

FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# one training step, small, into the test's folder: appended to every documented training command
ONE_STEP = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--data.batch_size", "2"]


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, tag, code) of every fenced block of ``page``, in order."""
    return [(lang, tag.strip(), code) for lang, tag, code in FENCE.findall(page.read_text())]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_short_and_keeps_the_commands_ci_and_users_run() -> None:
    text = README.read_text()
    assert len(text.encode()) < 10_000, f"README.md is {len(text.encode())} bytes; move detail into docs/"
    assert MAIN_JOB in text
    assert TEST_COMMAND in text  # .ci/run runs "the README's test command"
    ci = (REPO / ".ci" / "run").read_text()
    assert "export HF_HUB_OFFLINE=1" in ci and "export OMP_NUM_THREADS=1" in ci
    assert "\npython -m pytest -q -n 2\n" in ci


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.split("#")[0]).resolve() for t in relative_links(README)}
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) >= 11, pages
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_reach_existing_files_and_headings(page: Path) -> None:
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link {target} -> no {file}"
        if anchor:
            assert file.suffix == ".md", f"{page.name}: link {target} has an anchor into a non-Markdown file"
            assert anchor in anchors(file), f"{page.name}: link {target}: no heading '{anchor}' in {file.name}"


def _source_files() -> list[Path]:
    found = [
        p
        for d in ("lit_treegrpo", "callbacks", "tests", "benchmarks", "notebooks")
        for p in (REPO / d).rglob("*")
        if p.suffix in (".py", ".ipynb")
    ]
    return found + list((REPO / "configs").rglob("*.yaml")) + [REPO / "pyproject.toml", REPO / ".ci" / "run"]


def test_no_source_file_cites_a_markdown_file_the_repository_lacks() -> None:
    names = {
        p.name for p in REPO.rglob("*.md") if ".git" not in p.parts and not any(s.startswith(".venv") for s in p.parts)
    }
    outside = "/".join(["..", "shared"])  # written so that this file does not cite it
    problems = []
    for source in _source_files():
        text = source.read_text()
        if outside in text:
            problems.append(f"{source.relative_to(REPO)} cites {outside}")
        for cited in set(re.findall(r"[\w./-]*\w\.md\b", text)):
            exists = (REPO / cited).exists() or (source.parent / cited).exists() if "/" in cited else cited in names
            if not exists:
                problems.append(f"{source.relative_to(REPO)} cites {cited}")
    for page in PAGES:
        if outside in page.read_text():
            problems.append(f"{page.relative_to(REPO)} cites {outside}")
    assert not problems, problems


def _training_commands(code: str) -> list[list[str]]:
    """The documented ``python -m lit_treegrpo ...`` / ``python <launcher>.py ...`` lines of a bash block."""
    lines = code.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if re.match(r"python (-m lit_treegrpo|\w+\.py) ", line)]


def _write_example_project(folder: Path) -> tuple[list[str], list[list[str]]]:
    """Write the files of docs/extending.md into ``folder``; return its ``python run`` blocks and
    its training commands."""
    files: dict[str, str] = {}
    runs, commands = [], []
    for lang, tag, code in blocks(EXTENDING):
        if lang == "python" and tag == "run":
            runs.append(code)
        elif lang in ("python", "yaml") and tag:
            files[tag] = files.get(tag, "") + code
        elif lang == "bash":
            commands += _training_commands(code)
    assert set(files) == {"my_extensions.py", "train.py", "my_method.yaml"}, set(files)
    for name, code in files.items():
        (folder / name).write_text(code)
    (folder / "configs").symlink_to(REPO / "configs")  # the commands name configs/ from the repository root
    return runs, commands


@pytest.fixture
def example_project(tmp_path: Path, monkeypatch):
    """docs/extending.md's files in a fresh folder, the current directory and on sys.path; the
    reward registry and the imported example modules restored afterwards."""
    from lit_treegrpo.rewards import REWARDS

    runs, commands = _write_example_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(REWARDS)
    yield tmp_path, runs, commands
    REWARDS.clear()
    REWARDS.update(saved)
    for name in ("my_extensions", "train"):
        sys.modules.pop(name, None)


def test_the_extending_examples_run_as_written(example_project) -> None:
    folder, runs, commands = example_project
    assert len(runs) == 3 and len(commands) == 3, (len(runs), len(commands))
    namespace: dict = {}
    for i, code in enumerate(runs):
        exec(compile(code, f"{EXTENDING}:run-block-{i}", "exec"), namespace)
    assert isinstance(namespace["adv"], torch.Tensor)  # the last block trained one step and checked it


def test_the_extending_command_lines_build_their_runs(example_project) -> None:
    """Each documented command line, parsed, checked and built by the command line in this process
    (no training: the slow test below trains each for one step in its own process). ``train.py``
    imports ``my_extensions`` before it calls the command line; so does this test."""
    from lit_treegrpo.cli import TreeGRPOCLI
    from lit_treegrpo.training.module import TreeGRPOModule

    folder, _, commands = example_project
    for i, argv in enumerate(commands):
        launcher = argv[1] != "-m"
        if launcher:
            assert argv[1] == "train.py" and argv[2] == "fit", argv
            import my_extensions  # noqa: F401  (what train.py does first)
        args = argv[3:] if launcher else argv[4:]  # after the "fit" subcommand
        cli = TreeGRPOCLI(args=[*args, *ONE_STEP, "--trainer.default_root_dir", str(folder / f"run{i}")], run=False)
        model = cli.model
        assert isinstance(model, TreeGRPOModule) and model.tree.num_steps == model.adapter.num_steps, argv
        for class_path in re.findall(r"my_extensions\.(\w+)", " ".join(argv)):
            assert class_path in (type(model.adapter).__name__, type(model.reward).__name__), argv
        if "redness" in " ".join(argv) and launcher:
            assert set(model.reward.score(torch.rand(2, 3, 8, 8), ["a", "a"]).components) == {"redness", "brightness"}


@pytest.mark.slow
def test_the_extending_command_lines_run_in_real_processes(tmp_path: Path) -> None:
    """As a user runs them: each in its own process from the example's folder, so a class_path or
    a registered name resolves only as it would there; and a registered name without the launcher
    is refused as the page says."""
    _, commands = _write_example_project(tmp_path)
    for i, argv in enumerate(commands):
        args = [sys.executable, *argv[1:], *ONE_STEP, "--trainer.default_root_dir", str(tmp_path / f"run{i}")]
        result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (argv, result.stderr[-3000:])
    refused = subprocess.run(
        [sys.executable, "-m", "lit_treegrpo", "fit", "--config", "configs/tiny.yaml", "--model.reward", "redness",
         "--trainer.default_root_dir", str(tmp_path / "refused")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "error: --model.reward: unknown reward 'redness'; known rewards:" in refused.stderr
