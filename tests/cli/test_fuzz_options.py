"""Issue 56's fuzzer: property tests (Hypothesis) that give ``python -m lit_treegrpo fit`` values a
careless or hostile user would, for every numeric and path option of the CLI's own option list
(:func:`tests.cli.fuzzing.cli_options`: read from its parser, the classes the configuration builds
included), one or two options per command line, over the shipped ``shapes`` and ``tiny`` configs
made to end in seconds (one training iteration, a small validation).

Each drawn command line runs once, as a real process, and must have these properties:

- **it ends**: within :data:`WALL_BOUND_S` (a normal run takes 10-30 s on two loaded cores), in a
  memory bound (:data:`MEMORY_BOUND`, the process's address space: an allocation past it fails);
- **it succeeds or refuses in one line**: exit status 0, or 2 with stderr's last line
  ``error: ...`` naming one of the options given (its full name, the name without ``init_args``, or
  its group with its own name: ``--model.tree: branching ...``); never a Python traceback;
- **it touches only its run's files**: a hash tree of the workspace (the user's files beside the run
  folder and inside it, an earlier run's files, FIFOs, links) is unchanged after the run but for
  files of the names a fit writes inside its run folder and its bookkeeping, and, when the command
  replaced an earlier run (``--overwrite true``) and got as far as a checkpoint, that run's files.

Values: integers and floats at and past the edges (zero, negatives, 1e9, 1e18, 1e308, past float64,
infinities and NaN in YAML's and Python's spellings, 64-bit overflow), lists of them, and for paths
the kinds of :data:`tests.cli.fuzzing.PATH_KINDS` (files, folders, a FIFO, links to a file, a folder,
nothing, themselves and ``/dev/zero``, names past ``NAME_MAX`` and ``PATH_MAX``, empty names, missing
paths). The command lines issue 56 found running unboundedly are pinned with ``@example`` in a test
of their own: always tried, and a failure among them does not stop Hypothesis from drawing.

Profiles (``LIT_TREEGRPO_FUZZ_PROFILE``): ``ci`` (the default: a fixed seed, 20 + 10 examples besides
the pinned ones, no example database, no shrinking, each test stopping at its first failing command
line: about 10 minutes on two loaded cores) and ``long`` (a new seed each run, 400 + 100 examples: hours). ``LIT_TREEGRPO_FUZZ_EXAMPLES=N`` sets both counts,
``LIT_TREEGRPO_FUZZ_TIMEOUT`` the wall bound in seconds, and ``LIT_TREEGRPO_FUZZ_LOG=FILE`` appends one
JSON line per command line run (its arguments, status, seconds, last stderr line, problems).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from .fuzzing import (
    FLOAT_TEXTS,
    INT_TEXTS,
    PATH_KINDS,
    GiB,
    Option,
    Workspace,
    changes_outside_the_run,
    cli_options,
    manifest_entries,
    override_file,
    parsed,
    problems_of,
    run_cli,
)

pytestmark = pytest.mark.slow

#: the shipped configs the command lines start from: the main job's, and the tiny SD3.5-shaped one
#: (whose adapter has the options of a diffusers model: ``resolution``, ``max_sequence_length`` ...)
BASES = ("shapes", "tiny")
#: what makes each end in seconds: one training iteration, a small batch and validation, and a
#: minute of training at most whatever run length is drawn (``--max_iterations 1000000``)
QUICK = {
    "shapes": ("--max_iterations", "1", "--trainer.max_time", "00:00:01:00", "--model.validate_at_start", "false",
               "--data.batch_size", "2", "--data.val_size", "2", "--model.val_samples", "1"),
    "tiny": ("--max_iterations", "1", "--trainer.max_time", "00:00:01:00", "--model.validate_at_start", "false"),
}  # fmt: skip
#: seconds a command line may take: far from the normal 10-30 s
WALL_BOUND_S = float(os.environ.get("LIT_TREEGRPO_FUZZ_TIMEOUT", "240"))
#: the address space a command line may take (a fit of either config stays well under it)
MEMORY_BOUND = 6 * GiB

settings.register_profile(
    "fuzz-ci",
    derandomize=True,  # the same examples every run
    database=None,  # no failing example saved for the next run (.hypothesis/ holds only a cache, git-ignored)
    deadline=None,  # an example is a process of 10-240 s
    phases=(Phase.explicit, Phase.generate),  # no shrinking: every smaller try is another process
    suppress_health_check=[HealthCheck.too_slow],  # the first draw parses the CLI's options (seconds)
    print_blob=False,
)
settings.register_profile("fuzz-long", parent=settings.get_profile("fuzz-ci"), derandomize=False)
PROFILE = os.environ.get("LIT_TREEGRPO_FUZZ_PROFILE", "ci")
EXAMPLES = {"ci": {"numbers": 20, "paths": 10}, "long": {"numbers": 400, "paths": 100}}[PROFILE]
if os.environ.get("LIT_TREEGRPO_FUZZ_EXAMPLES"):
    EXAMPLES = dict.fromkeys(EXAMPLES, int(os.environ["LIT_TREEGRPO_FUZZ_EXAMPLES"]))


def fuzz_settings(which: str) -> settings:
    """The profile's settings with the example count of ``which`` (``numbers`` or ``paths``)."""
    return settings(settings.get_profile(f"fuzz-{PROFILE}"), max_examples=EXAMPLES[which])


# ------------------------------------------------------------------------ what is drawn


def values_for(option: Option) -> st.SearchStrategy[str]:
    """Text for ``option`` as a user types it: edge integers and floats (an integer option gets a
    float now and then), lists of them, or a path kind of :data:`PATH_KINDS`."""
    ints = st.one_of(st.sampled_from(INT_TEXTS), st.integers().map(str))
    floats = st.one_of(st.sampled_from(FLOAT_TEXTS), st.floats().map(repr))
    if option.kind == "int":
        return st.one_of(ints, st.sampled_from(FLOAT_TEXTS))
    if option.kind == "float":
        return st.one_of(floats, ints)
    if option.kind == "numbers":
        return st.lists(st.one_of(ints, floats), max_size=3).map(lambda texts: "[" + ", ".join(texts) + "]")
    return st.sampled_from(sorted(PATH_KINDS))


def command_lines(paths: bool) -> st.SearchStrategy[tuple[str, tuple[tuple[str, str], ...]]]:
    """``(base config, ((option, value), ...))``: one or two numeric options (or path options, with
    ``paths``) of the base config's option list, each with a drawn value."""

    def for_base(base: str) -> st.SearchStrategy:
        options = [o for o in cli_options(base) if (o.kind == "path") == paths]
        one = st.sampled_from(options).flatmap(lambda o: values_for(o).map(lambda value: (o.key, value)))
        drawn = st.lists(one, min_size=1, max_size=2, unique_by=lambda pair: pair[0])
        return drawn.map(lambda pairs: (base, tuple(pairs)))

    return st.sampled_from(BASES).flatmap(for_base)


# ------------------------------------------------------------------------ one command line


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Callable[[], Path]:
    """A run folder holding a finished fit (built by the first example that asks for one)."""
    made: list[Path] = []

    def make() -> Path:
        if not made:
            root = tmp_path_factory.mktemp("earlier") / "run"
            args = ["fit", "--config", "shapes", *QUICK["shapes"], "--trainer.default_root_dir", str(root)]
            outcome = run_cli(args, cwd=root.parent, timeout=WALL_BOUND_S, memory=MEMORY_BOUND)
            assert outcome.returncode == 0, outcome.stderr[-3000:]
            made.append(root)
        return made[0]

    return make


def check_command_line(
    base: str, drawn: tuple[tuple[str, str], ...], with_earlier_run: bool, folder: Path, earlier: Callable[[], Path]
) -> None:
    """Run ``fit --config BASE`` quickly with the ``drawn`` options in a fresh workspace (the run
    folder ``run/`` holds the user's files, and with ``with_earlier_run`` an earlier run too, which
    the command then replaces with ``--overwrite true``) and assert the module docstring's properties."""
    options = {o.key: o for o in cli_options(base)}
    ws = Workspace.make(folder, earlier() if with_earlier_run else None)
    root = ws.path("the_run_folder")
    args = ["fit", "--config", base, *QUICK[base], "--trainer.default_root_dir", root]
    keys = [key for key, _ in drawn]
    overwrite = with_earlier_run and "ckpt_path" not in keys  # --overwrite true and --ckpt_path exclude each other
    if overwrite:
        args += ["--overwrite", "true"]
    texts = []
    for i, (key, value) in enumerate(drawn):
        text = ws.path(value) if options[key].kind == "path" else value
        texts.append(text)
        if options[key].in_a_list:  # a callback's argument: a config file sets it, after the base's
            override = ws.folder / f"override-{i}.yaml"
            override_file(override, parsed(base)[1], key, text)
            args += ["--config", str(override)]
        else:
            args += [f"--{key}", text]
        if key == "trainer.default_root_dir":
            root = text
    earlier_files = manifest_entries(ws.folder / "run")
    before = ws.tree()
    outcome = run_cli(args, cwd=ws.folder / "cwd", timeout=WALL_BOUND_S, memory=MEMORY_BOUND)
    after = ws.tree()
    # the earlier run may go once the new one has saved a checkpoint (or ended well)
    saved = any(
        rel.endswith(".ckpt") and sha != earlier_files.get(rel)
        for rel, sha in manifest_entries(ws.folder / "run").items()
    )
    replaced = overwrite and (outcome.returncode == 0 or saved)
    problems = problems_of(outcome, [options[key] for key in keys], texts, WALL_BOUND_S)
    problems += changes_outside_the_run(ws, before, after, root, earlier=earlier_files, may_replace_earlier=replaced)
    record = {
        "base": base, "drawn": drawn, "earlier_run": with_earlier_run, "command": outcome.shell(),
        "returncode": outcome.returncode, "seconds": round(outcome.seconds, 1), "last_line": outcome.last_line,
        "problems": problems, "stderr_tail": outcome.stderr[-4000:] if problems else "",
    }  # fmt: skip
    if os.environ.get("LIT_TREEGRPO_FUZZ_LOG"):
        with open(os.environ["LIT_TREEGRPO_FUZZ_LOG"], "a") as log:
            log.write(json.dumps(record) + "\n")
    if problems:
        tail = "\n".join(outcome.stderr.splitlines()[-30:])
        pytest.fail(
            f"{outcome.shell()}\n(in {ws.folder}/cwd; exit status {outcome.returncode} after {outcome.seconds:.1f} s)\n"
            + "".join(f"- {p}\n" for p in problems)
            + f"stderr's last lines:\n{tail}",
            pytrace=False,
        )
    shutil.rmtree(ws.folder)  # a failing example's workspace is kept for a look


# ------------------------------------------------------------------------ the properties


@settings(settings.get_profile(f"fuzz-{PROFILE}"), phases=(Phase.explicit,))
@given(case=command_lines(paths=False), with_earlier_run=st.booleans())
# issue 56's unbounded runs (validation, denoising steps, update epochs, the memory guard's probe):
@example(case=("shapes", (("model.val_samples", "1000000"),)), with_earlier_run=False)
@example(case=("shapes", (("model.adapter.init_args.num_steps", "1000000"),)), with_earlier_run=False)
@example(case=("shapes", (("model.inner_epochs", "1000000000"),)), with_earlier_run=False)
@example(case=("tiny", (("model.adapter.init_args.resolution", "100000"),)), with_earlier_run=False)
# ... its --overwrite trial (a new run refused in one line leaves the earlier one as it was) ...
@example(case=("shapes", (("model.tree.branching", "1000000"),)), with_earlier_run=True)
# ... and a FIFO where a file is read (refused, not waited on for ever)
@example(case=("shapes", (("data.prompts", "fifo"),)), with_earlier_run=False)
def test_the_values_issue_56_found_end_well_in_bounds_and_touch_only_the_runs_files(
    case: tuple[str, tuple[tuple[str, str], ...]], with_earlier_run: bool, tmp_path_factory, earlier_run
) -> None:
    """The command lines issue 56 found running unboundedly or destroying an earlier run, pinned
    (always tried, in every profile; kept apart from the drawn ones so that a failure here does not
    stop Hypothesis from drawing): the same properties as the drawn command lines."""
    base, drawn = case
    check_command_line(base, drawn, with_earlier_run, tmp_path_factory.mktemp("fuzz"), earlier_run)


@fuzz_settings("numbers")
@given(case=command_lines(paths=False), with_earlier_run=st.booleans())
def test_any_numbers_end_well_in_bounds_and_touch_only_the_runs_files(
    case: tuple[str, tuple[tuple[str, str], ...]], with_earlier_run: bool, tmp_path_factory, earlier_run
) -> None:
    """Numeric options (integers, floats, lists of them) at and past their edges: a fit ends with
    status 0, or 2 and one line naming the option; no traceback, within the wall and memory bounds,
    and no file but the run's own changed (the module docstring)."""
    base, drawn = case
    check_command_line(base, drawn, with_earlier_run, tmp_path_factory.mktemp("fuzz"), earlier_run)


@fuzz_settings("paths")
@given(case=command_lines(paths=True), with_earlier_run=st.booleans())
def test_any_paths_end_well_in_bounds_and_touch_only_the_runs_files(
    case: tuple[str, tuple[tuple[str, str], ...]], with_earlier_run: bool, tmp_path_factory, earlier_run
) -> None:
    """Path options (run folder, checkpoint, prompt files, the model's folder, config files) given
    files, folders, FIFOs, links, ``/dev/zero``, names too long, empty or missing: the same properties."""
    base, drawn = case
    check_command_line(base, drawn, with_earlier_run, tmp_path_factory.mktemp("fuzz"), earlier_run)
