"""Rule 4 (docs/failure_modes.md) for the environment: a flag reads as a boolean by one rule
(``lit_treegrpo.common.env.env_flag``): 0, false, no, off or empty is off; anything it does not
know is refused in one line naming the variable."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lit_treegrpo.common.env import env_flag
from tests.cli.test_cli import QUIET, TINY, _log_to_this_stderr

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "on"),
    [("", False), ("0", False), ("false", False), ("False", False), (" no ", False), ("OFF", False),
     ("1", True), ("true", True), ("Yes", True), ("on", True)],
)  # fmt: skip
def test_a_flag_reads_as_a_boolean(monkeypatch, value: str, on: bool) -> None:
    monkeypatch.setenv("LIT_TREEGRPO_SOME_FLAG", value)
    assert env_flag("LIT_TREEGRPO_SOME_FLAG") is on


def test_an_unset_flag_is_off_and_an_unknown_value_is_refused_naming_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("LIT_TREEGRPO_SOME_FLAG", raising=False)
    assert env_flag("LIT_TREEGRPO_SOME_FLAG") is False
    monkeypatch.setenv("LIT_TREEGRPO_SOME_FLAG", "maybe")
    with pytest.raises(ValueError, match=r"^LIT_TREEGRPO_SOME_FLAG='maybe': not a flag value; set it to 1"):
        env_flag("LIT_TREEGRPO_SOME_FLAG")


@pytest.mark.parametrize(("value", "traceback"), [("0", False), ("false", False), ("no", False), ("", False),
                                                  ("1", True), ("true", True), ("maybe", False)])  # fmt: skip
def test_the_debug_flag_turns_tracebacks_on_only_when_it_says_so(
    tmp_path: Path, capsys, monkeypatch, no_model, value: str, traceback: bool
) -> None:
    from lit_treegrpo.cli import DEBUG_ENV, main
    from lit_treegrpo.cli.user_errors import UserError

    monkeypatch.setenv(DEBUG_ENV, value)
    _log_to_this_stderr(monkeypatch)
    args = [
        "fit",
        "--config",
        str(TINY),
        *QUIET,
        "--model.tree.branchng",
        "3",
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    if traceback:
        with pytest.raises(UserError, match="--model.tree.branchng: no such option"):  # raised, not printed
            main(args)
        return
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(errors) == 1, errors
    expected = f"{DEBUG_ENV}='maybe': not a flag value" if value == "maybe" else "--model.tree.branchng: no such option"
    assert expected in errors[0], errors[0]


def test_the_package_reads_no_environment_flag_but_through_env_flag() -> None:
    """``os.environ.get(NAME)`` used as a truth value is the trap this rule closes (``=0`` was on):
    the package reads the environment only through env_flag, or for values that are not flags
    (process ranks, which launch_rank parses as numbers)."""
    allowed = {"lit_treegrpo/common/env.py", "lit_treegrpo/artifacts/run_folder.py"}
    found = []
    for path in sorted((REPO / "lit_treegrpo").rglob("*.py")) + sorted((REPO / "callbacks").rglob("*.py")):
        relative = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, (ast.Attribute, ast.Name))
                and ast.unparse(node)
                in (
                    "os.environ",
                    "os.getenv",
                    "getenv",
                )
                and relative not in allowed
            ):
                found.append(f"{relative}:{node.lineno}")
    assert not found, found
