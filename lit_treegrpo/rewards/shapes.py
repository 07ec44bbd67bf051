"""Compatibility: the Shapes reward lives with the rest of the Shapes testbed in :mod:`lit_treegrpo.shapes.reward`;
this name keeps configs and code of earlier versions working."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("lit_treegrpo.shapes.reward"), name)
