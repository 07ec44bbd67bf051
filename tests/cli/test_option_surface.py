"""The option surface stays what a user sets: ``fit --help`` (with the main job's config) fits on a
few screens, and nearly every module and data option appears in a shipped config, a benchmark or
the docs (an option nobody sets is a constant in disguise)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: where a user meets an option: the shipped configs, the benchmarks' code, the docs and the README
WHERE_USED = [*(REPO / "configs").rglob("*.yaml"), *(REPO / "benchmarks").rglob("*.py"), *(REPO / "docs").glob("*.md"),
              REPO / "README.md"]  # fmt: skip
#: options nothing sets, at most; today two: ``model.compute_cost.reference`` and ``.trained`` (the
#: cost model's weights, which docs/benchmarks.md explains by role, not by option name)
MOST_UNUSED = 5


@pytest.fixture(scope="module")
def fit_help() -> str:
    import contextlib
    import io

    from lit_treegrpo.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["fit", "--config", str(REPO / "configs" / "shapes.yaml"), "--help"])
    return out.getvalue()


def test_fit_help_with_the_main_jobs_config_is_under_500_lines(fit_help: str) -> None:
    assert "--model.tree" in fit_help
    assert len(fit_help.splitlines()) < 500, len(fit_help.splitlines())


def test_at_most_five_module_or_data_options_appear_nowhere_a_user_would_set_them(fit_help: str) -> None:
    used = "\n".join(path.read_text() for path in WHERE_USED)
    unused = []
    for option in sorted(set(re.findall(r"^  --((?:model|data)\.[\w.]+)", fit_help, flags=re.M))):
        leaf = option.rsplit(".", 1)[-1]
        if leaf == "help":
            continue
        # set in a YAML file (``leaf:``), given on a command line (``--model.x.leaf``) or named in the docs
        if not re.search(rf"(^|[^\w]){leaf}:|--{re.escape(option)}\b|`{leaf}`|{re.escape(option)}\b", used, flags=re.M):
            unused.append(option)
    assert len(unused) <= MOST_UNUSED, unused
