"""Rules 2 and 4 (docs/failure_modes.md) for YAML: a key given twice is an error naming the key and
its lines, a document is refused when its aliases expand it beyond the bound (in milliseconds,
before anything is built), a config file is read up to its size bound; for every YAML the command
line reads (a --config file, a section's own file, a value on the command line)."""

from __future__ import annotations

import builtins
import tracemalloc
from pathlib import Path

import pytest
import yaml

from lit_treegrpo.common.config_yaml import (
    MAX_CONFIG_BYTES,
    MAX_YAML_NODES,
    ConfigYAMLError,
    checked_loader,
    load_yaml,
    read_yaml_file,
)
from tests.cli.test_cli import QUIET, TINY, _main_error

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checks(monkeypatch) -> dict[str, int]:
    """The work of the YAML checks, counted: ``nodes``, the type tests :mod:`config_yaml` makes (a
    few per node it visits, each alias once), and ``chars``, ``texts``: the YAML texts it was given.
    A bound on these is a bound on work; a bound on seconds fails on a loaded machine."""
    from lit_treegrpo.common import config_yaml

    counts = {"nodes": 0, "chars": 0, "texts": 0}

    def counted(obj, kinds):
        counts["nodes"] += 1
        return builtins.isinstance(obj, kinds)

    init = config_yaml._Checks.__init__

    def counted_init(self, stream):
        counts["texts"] += 1
        counts["chars"] += len(stream) if builtins.isinstance(stream, (str, bytes)) else 0
        init(self, stream)

    monkeypatch.setattr(config_yaml, "isinstance", counted, raising=False)  # the module's global, not the builtin
    monkeypatch.setattr(config_yaml._Checks, "__init__", counted_init)
    return counts


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """``levels`` nested anchors, each a list of ``width`` aliases of the one before: a few hundred
    bytes that expand to ``width ** levels`` values."""
    lines, previous = [f"a0: &a0 [{', '.join(['x'] * width)}]"], "a0"
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*{previous}'] * width)}]")
        previous = f"a{level}"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("trainer:\n  max_steps: 3\n  max_steps: 5\n", "max_steps", "2 and 3"),
        ("model:\n  seed: 1\ndata: {}\nmodel:\n  seed: 2\n", "model", "1 and 4"),
        ("model: {tree: {branching: 2, branching: 3}}\n", "branching", "1 and 1"),
        ("1: a\n1: b\n", 1, "1 and 2"),
        ("a: [{k: 1, k: 2}]\n", "k", "1 and 1"),
    ],
)
def test_a_key_given_twice_names_the_key_and_its_lines(text: str, key: object, lines: str) -> None:
    with pytest.raises(ConfigYAMLError, match=rf"the key {key!r} is given twice in one mapping, at lines {lines}"):
        load_yaml(text)


def test_merge_keys_may_be_overridden_and_distinct_keys_load() -> None:
    text = "base: &b {lr: 0.1, seed: 1}\nrun:\n  <<: *b\n  lr: 0.2\n"
    assert load_yaml(text) == {"base": {"lr": 0.1, "seed": 1}, "run": {"lr": 0.2, "seed": 1}}


def test_an_alias_bomb_is_refused_in_milliseconds_without_growing(checks) -> None:
    text = alias_bomb()
    assert len(text) < 500  # the size of the trial's (342 bytes); 9 ** 9 = 387 million values
    tracemalloc.start()
    with pytest.raises(ConfigYAMLError, match=rf"expands to more than {MAX_YAML_NODES:,} values through its aliases"):
        load_yaml(text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # milliseconds by construction: the check looks at the graph, each alias once (75 type tests
    # here), never at the 387 million values it expands to
    assert checks["nodes"] <= len(text) and peak < 20_000_000, (checks, peak)


def test_aliases_within_the_bound_load_and_a_self_reference_does_not() -> None:
    assert load_yaml(alias_bomb(levels=3, width=3))["a2"] == [[["x"] * 3] * 3] * 3
    with pytest.raises(ConfigYAMLError, match="refers to a value that contains it"):
        load_yaml("a: &x [1, *x]\n")


def test_every_shipped_config_loads_far_below_the_bounds() -> None:
    from jsonargparse._loaders_dumpers import get_yaml_default_loader

    loader = checked_loader(get_yaml_default_loader())
    configs = sorted((REPO / "configs").rglob("*.yaml"))
    assert len(configs) > 20
    for path in configs:
        assert path.stat().st_size < MAX_CONFIG_BYTES / 100, path
        load_yaml(path.read_text(), loader)  # no duplicate key, no alias over the bound
        nodes = yaml.compose(path.read_text(), Loader=loader)
        assert nodes is not None


def test_every_yaml_text_is_bounded_before_it_is_parsed(monkeypatch) -> None:
    base = checked_loader().__mro__[2]  # the PyYAML loader under the checks (_Checks comes first)

    def parsed(*args, **kwargs):
        raise AssertionError("a text over the bound reached the YAML parser")

    monkeypatch.setattr(base, "__init__", parsed)  # the parser's setup: refused before it, in no time
    with pytest.raises(ConfigYAMLError, match=rf"more than the {MAX_CONFIG_BYTES:,} this project reads"):
        load_yaml("prompts: [" + "a, " * (MAX_CONFIG_BYTES // 3) + "b]")


def test_a_config_file_over_the_size_bound_is_refused_naming_it(tmp_path: Path, monkeypatch) -> None:
    from lit_treegrpo.common import config_yaml

    path = tmp_path / "big.yaml"
    path.write_text("trainer:\n  max_steps: 3\n" + "# padding\n" * 100)
    monkeypatch.setattr(config_yaml, "MAX_CONFIG_BYTES", 200)
    with pytest.raises(ValueError, match=rf"^--config {path}: {path} is larger than 200 bytes"):
        read_yaml_file(path, f"--config {path}")


@pytest.mark.parametrize(
    ("where", "text", "message"),
    [
        ("file", "trainer:\n  max_steps: 3\n  max_steps: 5\n", "the key 'max_steps' is given twice in one mapping, at lines 2 and 3"),
        ("file", "model:\n  seed: 1\nmodel:\n  seed: 2\n", "the key 'model' is given twice in one mapping, at lines 1 and 3"),
        ("file", alias_bomb() + "trainer:\n  callbacks: *a8\n", "expands to more than 100,000 values"),
        ("value", "{brightness: {target: 0.5, target: 0.2}}", "--model.reward_kwargs: the key 'target' is given twice"),
        ("value", "{" + alias_bomb().replace("\n", ", ").rstrip(", ") + "}", "--model.reward_kwargs: the document expands"),
        ("section", "branching: 2\nbranching: 3\n", "the key 'branching' is given twice in one mapping, at lines 1 and 2"),
    ],
)  # fmt: skip
def test_the_command_line_refuses_duplicates_and_bombs_wherever_yaml_enters(
    tmp_path: Path, capsys, monkeypatch, no_model, checks, where: str, text: str, message: str
) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text(text)
    args = {
        "file": ["--config", str(path)],
        "value": ["--model.reward_kwargs", text],
        "section": ["--model.tree", str(path)],  # a section read from its own file, by jsonargparse
    }[where]
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *args,
                       "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert message in line, line
    if where == "file":
        assert line.startswith(f"error: --config {path}: "), line
    # no expansion: the parse alone, the checks' work linear in the YAML given (a few type tests per
    # value, at most 5 for a one-character value such as "0"), never in the values a bomb expands to
    assert checks["nodes"] <= checks["chars"] + 5 * checks["texts"], checks
    assert not (tmp_path / "run").exists()
