"""What the command line checks before it imports Lightning, diffusers or the model code (seconds,
not the half minute those imports take), in the order a user fixes them:

1. the model's weights (:func:`check_weights`): a real model family's ``pretrained`` must be a local
   diffusers folder of the layout its pipeline writes, or a hub id in the local cache or reachable;
   else one line naming ``--model.adapter.init_args.pretrained`` and the layout expected;
2. the rewards' extra packages (:func:`check_extras`), whose install line follows the README's
   torch choice.

Everything else is checked once the command line is parsed (:mod:`lit_treegrpo.cli.checks`).

:func:`resolve_config_names` lets ``--config`` name a shipped config (``--config shapes``,
``--config methods/mixgrpo``): the ``configs/`` of the checkout, or the copy the wheel installs in
the package, as litgpt's config hub does, so that the README's commands run from an installed wheel
too.

Imports the standard library, PyYAML and the package's ``common``; ``huggingface_hub`` and the
reward registry (torch) only when a configuration needs them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from ..common.config_yaml import read_yaml_file
from ..common.files import MiB, read_text_limited
from ..common.hub import download_command, looks_like_path

DEBUG_ENV = "LIT_TREEGRPO_DEBUG"
SUBCOMMANDS = ("fit", "validate", "test", "predict", "export")
PRETRAINED = "--model.adapter.init_args.pretrained"

#: adapter class -> (its diffusers pipeline, the folder layout it loads, a hub id it takes)
FAMILIES = {
    "SD15Adapter": (
        "StableDiffusionPipeline",
        "unet/, vae/, text_encoder/, tokenizer/, scheduler/",
        "stable-diffusion-v1-5/stable-diffusion-v1-5",
    ),
    "SD3Adapter": (
        "StableDiffusion3Pipeline",
        "transformer/, vae/, text_encoder/, text_encoder_2/, text_encoder_3/, tokenizer/, tokenizer_2/, tokenizer_3/, scheduler/",
        "stabilityai/stable-diffusion-3.5-medium",
    ),
    "FluxAdapter": (
        "FluxPipeline",
        "transformer/, vae/, text_encoder/, text_encoder_2/, tokenizer/, tokenizer_2/, scheduler/",
        "black-forest-labs/FLUX.1-dev",
    ),
    "QwenImageAdapter": (
        "QwenImagePipeline",
        "transformer/, vae/, text_encoder/, tokenizer/, scheduler/",
        "Qwen/Qwen-Image",
    ),
    "WanAdapter": (
        "WanPipeline",
        "transformer/ (and transformer_2/ for Wan2.2 A14B), vae/, text_encoder/, tokenizer/, scheduler/",
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
    ),
}
SHAPES_PARTS = ("transformer", "text_encoder", "tokenizer", "scheduler")


class FirstCheckError(ValueError):
    """A configuration that cannot run, found before the heavy imports (one line)."""


def asks_for_help(args: Any) -> bool:
    """Whether a command line (``args``; None: ``sys.argv``) asks for a help text: ``-h``,
    ``--help`` or a class's ``--<option>.help``. A configuration given as a dict asks for it too."""
    argv = sys.argv[1:] if args is None else args
    if not isinstance(argv, (list, tuple)):
        return True
    return any(
        a in ("-h", "--help") or (a.startswith("--") and a.split("=", 1)[0].endswith(".help")) for a in map(str, argv)
    )


# ------------------------------------------------------------------------ shipped configs
def config_folder() -> Path | None:
    """The shipped configs: ``lit_treegrpo/configs`` in an installed wheel, the repository's
    ``configs/`` in a checkout (None when neither is there)."""
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "configs", package.parent / "configs"):
        if (folder / "shapes.yaml").is_file():
            return folder
    return None


def shipped_configs() -> list[str]:
    """The names ``--config`` takes for the shipped configs (``shapes``, ``methods/mixgrpo`` ...)."""
    folder = config_folder()
    if folder is None:
        return []
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


def shipped_config(name: str) -> Path | None:
    """The shipped config ``name`` names: ``shapes``, ``shapes.yaml``, ``methods/mixgrpo`` or
    ``configs/shapes.yaml`` (the README's path, from another folder); None when there is none."""
    folder = config_folder()
    if folder is None or Path(name).is_absolute():
        return None
    relative = Path(name)
    if relative.parts and relative.parts[0] == "configs":
        relative = Path(*relative.parts[1:])
    if relative.suffix != ".yaml":
        relative = relative.with_name(relative.name + ".yaml")
    candidate = folder / relative
    return candidate if ".." not in relative.parts and candidate.is_file() else None


def resolve_config_names(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config`` / ``-c`` that is no file replaced by the shipped config it
    names; a name that is neither is refused in one line listing the shipped ones."""
    out = list(argv)
    for i, arg in enumerate(map(str, argv)):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = _resolved(str(out[i + 1]))
        elif arg.startswith("--config="):
            out[i] = "--config=" + _resolved(arg.split("=", 1)[1])
    return out


def _resolved(given: str) -> str:
    if Path(given).expanduser().exists() or given.lstrip().startswith(("{", "[")) or "\n" in given:
        return given  # a file, or a configuration given inline
    found = shipped_config(given)
    if found is not None:
        return str(found)
    names = ", ".join(shipped_configs()) or "none found"
    raise FirstCheckError(f"--config {given}: no such file, and no shipped config of that name (shipped: {names})")


# ------------------------------------------------------------------------ the configuration, roughly
def _merge(base: Any, over: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    merged = dict(base)
    for key, value in over.items():
        if (
            key == "init_args"
            and isinstance(over.get("class_path"), str)
            and over["class_path"] != base.get("class_path")
        ):
            merged[key] = value  # another class: the earlier one's arguments do not carry over
        else:
            merged[key] = _merge(base.get(key), value)
    return merged


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = value


def model_options(argv: list[str]) -> dict[str, Any] | None:
    """The ``model`` section the command line gives, from its ``--config`` files and the few
    options read here (the adapter's class and ``pretrained``, the reward), merged in order as the
    parser would; None when it cannot tell (help, an unreadable file: the parser reports those)."""
    config: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = str(argv[i])
        if arg.startswith("-") and "=" in arg:
            (key, value), step = arg.split("=", 1), 1
        elif arg.startswith("-"):  # every option of the parser takes a value
            key, value, step = arg, str(argv[i + 1]) if i + 1 < len(argv) else None, 2
        else:  # the subcommand
            key, value, step = arg, None, 1
        i += step
        if key in ("--help", "-h") or key.startswith("--print_config"):
            return None
        if value is None:
            continue
        if key in ("--config", "-c"):
            try:
                loaded = read_yaml_file(value, f"--config {value}")
            except (OSError, ValueError):
                return None  # the parser's own checks name it
            if isinstance(loaded, dict):
                config = _merge(config, loaded)
        elif key == "--model.adapter" and not value.lstrip().startswith("{"):
            config = _merge(config, {"model": {"adapter": {"class_path": value, "init_args": {}}}})
        elif key in ("--model.adapter.class_path", PRETRAINED):
            _set(config, key[2:], value)
        elif key == "--model.reward":
            _set(config, "model.reward", yaml.safe_load(value) if value.lstrip().startswith("{") else value)
    model = config.get("model")
    return model if isinstance(model, dict) else {}


# ------------------------------------------------------------------------ the checks
def check_weights(model: dict[str, Any]) -> None:
    """Refuse a real model family's ``pretrained`` that cannot be loaded: a path that is no folder
    of its pipeline's layout, or a hub id neither cached nor reachable (see the module docstring)."""
    adapter = model.get("adapter")
    if not isinstance(adapter, dict) or not isinstance(adapter.get("class_path"), str):
        return
    family = adapter["class_path"].rpartition(".")[2]
    args = adapter.get("init_args") if isinstance(adapter.get("init_args"), dict) else {}
    pretrained = args.get("pretrained")
    if family == "ShapesAdapter":
        _check_shapes_folder(pretrained)
    if family not in FAMILIES or not isinstance(pretrained, str):
        return
    pipeline, layout, example = FAMILIES[family]
    wanted = f"a folder that {pipeline}.save_pretrained wrote (model_index.json, {layout})"
    path = Path(pretrained).expanduser()
    if path.exists() or looks_like_path(pretrained):
        _check_pipeline_folder(path, pretrained, wanted, example)
        return
    cached, why = _hub_status(pretrained)
    if not cached and why:
        raise FirstCheckError(
            f"{PRETRAINED} {pretrained}: the model's weights are not in the local hub cache and {why}; download "
            f"them once where the hub can be reached ({download_command(pretrained)}), or set {PRETRAINED} "
            f"to {wanted}"
        )


def _check_pipeline_folder(path: Path, given: str, wanted: str, example: str) -> None:
    if not path.is_dir():
        raise FirstCheckError(f"{PRETRAINED} {given}: no such folder; give {wanted}, or a hub id such as {example}")
    index = path / "model_index.json"
    if not index.is_file():
        raise FirstCheckError(f"{PRETRAINED} {given}: holds no model_index.json; give {wanted}")
    try:
        parts = json.loads(read_text_limited(index, MiB, f"{PRETRAINED} {given}"))
    except (OSError, ValueError) as err:
        raise FirstCheckError(f"{PRETRAINED} {given}: cannot read {index} ({err}); give {wanted}") from None
    missing = [
        name
        for name, spec in (parts.items() if isinstance(parts, dict) else [])
        if not name.startswith("_") and isinstance(spec, list) and spec and spec[0] and not (path / name).is_dir()
    ]
    if missing:
        raise FirstCheckError(
            f"{PRETRAINED} {given}: its model_index.json lists {', '.join(missing)}, which the folder lacks; give {wanted}"
        )


def _check_shapes_folder(pretrained: Any) -> None:
    if not isinstance(pretrained, str) or pretrained == "builtin":
        return
    path = Path(pretrained).expanduser()
    missing = [part for part in SHAPES_PARTS if not (path / part).is_dir()]
    if missing:
        what = "no such folder" if not path.is_dir() else f"lacks {', '.join(f'{m}/' for m in missing)}"
        raise FirstCheckError(
            f"{PRETRAINED} {pretrained}: {what}; give builtin (the shipped model) or a Shapes model folder "
            f"({', '.join(f'{p}/' for p in SHAPES_PARTS)}, as ShapesAdapter.save_pretrained and the pre-training write)"
        )


def _hub_status(repo_id: str) -> tuple[bool, str]:
    """(cached, why it cannot be fetched: "" when the hub can be asked)."""
    from ..common.hub import hub_reachable, in_hub_cache

    if in_hub_cache(repo_id):
        return True, ""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False, "HF_HUB_OFFLINE is set"
    if not hub_reachable():
        return False, f"{constants.ENDPOINT} cannot be reached"
    return False, ""


def check_extras(model: dict[str, Any]) -> None:
    """Refuse a reward whose extra package is missing, with the line that installs it."""
    reward = model.get("reward")
    names = [reward] if isinstance(reward, str) else list(reward) if isinstance(reward, dict) else []
    if not names:
        return
    from ..rewards.registry import REQUIREMENTS, check_reward_available

    for name in names:
        if isinstance(name, str) and name in REQUIREMENTS:
            try:
                check_reward_available(name)
            except ImportError as err:
                raise FirstCheckError(f"--model.reward: {err}") from err  # as the later check says it


# ------------------------------------------------------------------------ the values as typed
#: the longest name of one folder or file, and of a whole path, on Linux (and most systems)
NAME_MAX, PATH_MAX = 255, 4096


def negative_values_joined(argv: list[str]) -> list[str]:
    """``--option -4e16`` as ``--option=-4e16``: argparse takes a value that starts with '-' and is not a plain
    integer or decimal (an exponent, ``-inf``) for an option, and then says the option before it lacks its value."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg, value = str(argv[i]), str(argv[i + 1]) if i + 1 < len(argv) else ""
        if arg.startswith("--") and "=" not in arg and value.startswith("-") and _is_number(value):
            out.append(f"{arg}={value}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_path_lengths(argv: list[str]) -> None:
    """Refuse, naming the option, a value that can only be a path and is longer than the system allows (a name past
    :data:`NAME_MAX` bytes, a path past :data:`PATH_MAX`): the first look at it (``Path.exists``) raised ``OSError``
    with a traceback, and later ones named the path but not the option. A value with a space, or YAML, is no path."""
    option = None
    for arg in map(str, argv):
        if arg.startswith("-") and not _is_number(arg):
            option, _, value = arg.partition("=")
            if not value:
                continue
        else:
            value = arg
        if option is None or any(c.isspace() for c in value) or value.startswith(("{", "[")):
            continue
        encoded = os.fsencode(value)
        longest = max((len(part) for part in encoded.split(b"/")), default=0)
        if longest > NAME_MAX or len(encoded) > PATH_MAX:
            what = f"a name of {longest} bytes (at most {NAME_MAX})" if longest > NAME_MAX else f"{len(encoded)} bytes"
            raise FirstCheckError(
                f"{option}: the path is longer than this system allows ({what}, paths at most {PATH_MAX}); give a "
                "shorter one"
            )


def first_checks(argv: list[str]) -> list[str]:
    """Run the checks of the module docstring on the command line ``argv``; returns it with the
    shipped configs' names resolved."""
    argv = negative_values_joined(argv)
    check_path_lengths(argv)  # before anything looks at a path (Path.exists raises on one too long)
    argv = resolve_config_names(argv)
    if not any(a in SUBCOMMANDS for a in argv):
        return argv
    model = model_options(argv)
    if model is not None:
        check_weights(model)
        check_extras(model)
    return argv


__all__ = ["DEBUG_ENV", "FirstCheckError", "first_checks", "resolve_config_names", "shipped_configs"]
