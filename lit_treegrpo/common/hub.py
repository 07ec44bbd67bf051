"""Hugging Face hub look-ups that fail in seconds without a network."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

PROBE_SECONDS = 5.0
"""How long a probe waits for a TCP connection to the hub before counting it as unreachable."""


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether a TCP connection to the hub's endpoint (``HF_ENDPOINT``) opens within ``timeout``."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def in_hub_cache(repo_id: str) -> bool:
    """Whether a snapshot of ``repo_id`` lies in the local hub cache (no network involved)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(repo_id, local_files_only=True)
    except LocalEntryNotFoundError:
        return False
    return True


def require_hub(repo_id: str) -> None:
    """Raise ``OSError`` at once when ``repo_id`` is not cached and the hub cannot be asked
    (``HF_HUB_OFFLINE`` set, or the probe failed); return when loading it can go ahead."""
    from huggingface_hub import constants

    if in_hub_cache(repo_id):
        return
    if constants.HF_HUB_OFFLINE:
        raise OSError(f"{repo_id} is not in the local hub cache and HF_HUB_OFFLINE is set")
    if not hub_reachable():
        raise OSError(f"{repo_id} is not in the local hub cache and {constants.ENDPOINT} is unreachable")


def download_command(repo_id: str) -> str:
    """The command that downloads ``repo_id`` with the CLI the installed ``huggingface_hub`` ships: ``hf`` from 0.34
    on (``huggingface-cli`` was removed in 1.0), ``huggingface-cli`` before. Reads the version without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("huggingface_hub").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        major, minor = 1, 0  # not installed or an unusual version string: today's CLI
    cli = "hf" if (major, minor) >= (0, 34) else "huggingface-cli"
    return f"{cli} download {repo_id}"


def starts_like_path(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` is a path by its form alone: a ``Path``, or text that starts with ``/``, ``.``
    or ``~``, or holds an OS path separator other than ``/`` (a hub id never does)."""
    if isinstance(spec, os.PathLike):
        return True
    text = str(spec)
    separators = {os.sep, os.altsep} - {None, "/"}
    return text.startswith(("/", ".", "~")) or any(sep in text for sep in separators)


def looks_like_path(spec: str | os.PathLike[str]) -> bool:
    """:func:`starts_like_path`, or more than one ``/``: a hub id is ``name`` or ``org/name``."""
    return starts_like_path(spec) or str(spec).count("/") > 1


def local_or_hub_id(spec: str | os.PathLike[str]) -> str | None:
    """Where a model or reward source lives: ``None`` for a local path, else its hub id."""
    if Path(spec).expanduser().exists():
        return None
    if looks_like_path(spec):
        raise FileNotFoundError(f"no such file or folder '{spec}'")
    return str(spec)
