"""How the project reads YAML: every document bounded and unambiguous (rules 2 and 4 of
docs/failure_modes.md)."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .files import MiB, read_text_limited

#: the most values (scalars, lists and mappings, each alias counted at its full size) one YAML
#: document may expand to; the shipped configs have a few hundred
MAX_YAML_NODES = 100_000
#: the largest YAML file the project reads (the shipped configs are below 4 KiB)
MAX_CONFIG_BYTES = 4 * MiB
_MERGE = "tag:yaml.org,2002:merge"


class ConfigYAMLError(ValueError):
    """A YAML document the project refuses: a duplicate key, aliases expanding it beyond the bound,
    an alias that refers to itself (one line, with the line number)."""


def _expanded_size(root: Node, limit: int) -> int:
    """How many values ``root`` expands to, every alias at its full size; counted on the graph
    (each node once), so it takes time linear in the document, not in its expansion."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    # iterative post-order: a deeply nested document cannot exhaust Python's stack here
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            if isinstance(node, SequenceNode):
                children = node.value
            elif isinstance(node, MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = []
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > limit:
                raise ConfigYAMLError(
                    f"the document expands to more than {limit:,} values through its aliases (*name), at line "
                    f"{node.start_mark.line + 1}; a configuration this large is refused: write the values out, or "
                    "use fewer nested aliases"
                )
            continue
        if key in sizes:
            continue
        if key in active:
            raise ConfigYAMLError(
                f"an alias at line {node.start_mark.line + 1} refers to a value that contains it, which would "
                "expand without end; remove the alias"
            )
        active.add(key)
        stack.append((node, True))
        if isinstance(node, SequenceNode):
            stack += [(c, False) for c in reversed(node.value)]
        elif isinstance(node, MappingNode):
            stack += [(n, False) for pair in reversed(node.value) for n in reversed(pair)]
    return sizes[id(root)]


class _Checks:
    """The checks, as a mixin of a PyYAML loader class (:func:`checked_loader`)."""

    max_nodes = MAX_YAML_NODES

    def __init__(self, stream: Any) -> None:
        # every text jsonargparse parses comes here, a section's own file included
        if isinstance(stream, (str, bytes)) and len(stream) > MAX_CONFIG_BYTES:
            raise ConfigYAMLError(
                f"a YAML text of {len(stream):,} characters, more than the {MAX_CONFIG_BYTES:,} this project reads; "
                "give a smaller configuration"
            )
        super().__init__(stream)  # type: ignore[call-arg]

    def construct_document(self, node: Node) -> Any:
        _expanded_size(node, self.max_nodes)
        return super().construct_document(node)  # type: ignore[misc]

    def construct_mapping(self, node: Node, deep: bool = False) -> Any:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE or not isinstance(key_node, ScalarNode):
                    continue  # merged keys may be overridden; a complex key is refused by PyYAML itself
                key = self.construct_object(key_node)  # type: ignore[attr-defined]
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigYAMLError(
                        f"the key {key!r} is given twice in one mapping, at lines {seen[key]} and {line}; "
                        "keep one (YAML would silently use the last)"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


_checked: dict[type, type] = {}


def checked_loader(base: type | None = None) -> type:
    """``base`` (a PyYAML loader class; default: the C-accelerated safe loader when available)
    with the checks of this module."""
    base = base or getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if issubclass(base, _Checks):
        return base
    if base not in _checked:
        _checked[base] = type(f"Checked{base.__name__}", (_Checks, base), {})
    return _checked[base]


def use_checked_yaml() -> None:
    """Make jsonargparse read every YAML it loads (config files, a section's file, a value on the
    command line) with these checks, keeping its own number resolution: its loaders all take the
    class from this one module-level setting. Both command lines call it."""
    from jsonargparse import _loaders_dumpers

    _loaders_dumpers.yaml_default_loader = checked_loader(_loaders_dumpers.get_yaml_default_loader())


def load_yaml(text: str, loader: type | None = None) -> Any:
    """``text`` loaded with :func:`checked_loader` (``loader``: an already checked class)."""
    try:
        return yaml.load(text, Loader=loader or checked_loader())  # noqa: S506 (a safe loader, checked)
    except RecursionError:  # the pure-Python parser on a document nested thousands deep
        raise ConfigYAMLError(
            "the document nests lists or mappings deeper than the parser can follow; flatten it"
        ) from None


def read_yaml_file(path: Any, what: str) -> Any:
    """A YAML file read under :data:`MAX_CONFIG_BYTES` and loaded with the checks; errors start with
    ``what`` (the option or file) and give the line."""
    text = read_text_limited(path, MAX_CONFIG_BYTES, what)
    try:
        return load_yaml(text)
    except ConfigYAMLError as err:
        raise ConfigYAMLError(f"{what}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
        raise ConfigYAMLError(f"{what}: not valid YAML: {problem}{where}; fix the file") from err
