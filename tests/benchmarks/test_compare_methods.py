"""One home per method: the presets in configs/methods are whole methods, and the benchmark trains
exactly what ``fit --config configs/shapes.yaml --config configs/methods/NAME.yaml`` trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from compare.methods import (
    ARMS,
    HEADLINE,
    OFFICIAL,
    REMEDIES,
    TASK,
    VARIANTS,
    RunSpec,
    method_names,
    preset,
    preset_files,
    run_args,
)
from compare.runs import Protocol, train

from lit_treegrpo.cli import TreeGRPOCLI
from lit_treegrpo.core import TreeSpec

# per prompt, at the window's first offset: leaves, model evaluations, trained edges, trained forwards
SIZES = {
    "treegrpo": (27, 1 + 3 + 9 + 27 * 7, 3 + 9 + 27, 1 + 3 + 9),
    "treegrpo_softmax": (27, 1 + 3 + 9 + 27 * 7, 3 + 9 + 27, 1 + 3 + 9),
    # splits at 0, 3, 6 (k=3) and SDE steps 1, 2, 4, 5, 7: nodes 1, 3, 3, 3, 9, 9, 9, 27, 27, 27
    "branchgrpo": (27, 1 + 3 * 3 + 9 * 3 + 27 * 3, 3 * 3 + 9 * 3 + 27 * 2, 1 + 3 + 3 + 3 + 9 + 9 + 9 + 27),
    "branchgrpo_pruned": (27, 118, 90, 64),
    # the splits plus the SDE step 1 only: edges 3 (step 0) + 3 (step 1) + 9 (step 3) + 27 (step 6)
    "branchgrpo_mix": (27, 118, 3 + 3 + 9 + 27, 1 + 3 + 3 + 9),
    "dancegrpo": (27, 27 * 10, 27 * 8, 27 * 8),
    "flowgrpo": (27, 27 * 10, 27 * 8, 27 * 8),
    "mixgrpo": (27, 27 * 10, 27 * 4, 27 * 4),
    # k=2 at steps 0-3 (nodes 1, 2, 4, 8, then 16 on the six steps left); TreeGRPO trains the splits only
    "treegrpo_official": (16, 1 + 2 + 4 + 8 + 16 * 6, 2 + 4 + 8 + 16, 1 + 2 + 4 + 8),
    # ... BranchGRPO also the SDE steps 4-7
    "branchgrpo_official": (16, 1 + 2 + 4 + 8 + 16 * 6, 2 + 4 + 8 + 16 + 16 * 4, 1 + 2 + 4 + 8 + 16 * 4),
    "branchgrpo_binary": (16, 1 + 2 + 4 + 8 + 16 * 6, 2 + 4 + 8 + 16 + 16 * 4, 1 + 2 + 4 + 8 + 16 * 4),
}
# the other screen arms and the remedy arms change no tree at its first offset: their base preset's
SIZES.update({arm: SIZES[base] for arm, base in {**ARMS, **REMEDIES}.items() if arm not in SIZES})
METHOD_KEYS = ("tree", "advantage", "loss", "minibatches", "edges_per_update", "inner_epochs")


@pytest.fixture(scope="module")
def parser():
    return TreeGRPOCLI(args=["--config", str(TASK), "--trainer.logger", "false"], run=False).parser


def method_of(parser, *configs: Path) -> dict:
    """The method part of the configuration the CLI parses from ``configs`` (later files win)."""
    cfg = parser.parse_args([a for c in configs for a in ("--config", str(c))]).as_dict()
    model, adapter = cfg["model"], cfg["model"]["adapter"]["init_args"]
    schedules = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("PruningSchedule")]
    return {
        **{k: model[k] for k in METHOD_KEYS},
        "num_steps": adapter["num_steps"],  # the adapter owns it; the tree takes it
        "dynamics": adapter["dynamics"],
        "noise_level": adapter["noise_level"],
        "pruning": schedules,
    }


def test_every_method_has_one_preset() -> None:
    assert (
        set(method_names()) == set(HEADLINE) | set(VARIANTS) | set(OFFICIAL) | set(ARMS) | set(REMEDIES) == set(SIZES)
    )
    # a screen arm is its base preset and one file; every other method is one preset
    assert all(preset_files(arm) == [preset(base), preset(arm)] for arm, base in ARMS.items())


@pytest.mark.parametrize("name", sorted(SIZES))
def test_a_preset_states_the_whole_method_whatever_the_base_config_says(parser, name: str) -> None:
    alone = method_of(parser, TASK, *preset_files(name))
    # composed over another method first, nothing of that method leaks through
    for other in ("mixgrpo", "branchgrpo", "flowgrpo"):
        assert method_of(parser, TASK, preset(other), *preset_files(name)) == alone, other
    assert alone["tree"]["num_steps"] is None and alone["num_steps"] == 10  # stated once, by the adapter
    spec = TreeSpec.from_dict(alone["tree"]).with_num_steps(10)  # its own steps: the window at offset 0
    assert (spec.num_leaves, spec.nfe(), spec.num_edges(), spec.train_nfe()) == SIZES[name]
    for step in (0, 9, 10, 49, 50, 1000):  # a moving window stays off the deterministic tail
        moved = spec.at(step, run_seed=7)
        assert moved.num_leaves == SIZES[name][0] and all(s < 8 for s in moved.branch_steps + moved.sde_steps)


# dancegrpo: its pruning schedule is a callback; the official presets: their optimizer options and tree
@pytest.mark.parametrize(
    "name",
    ["treegrpo", "dancegrpo", "treegrpo_official", "branchgrpo_official", *REMEDIES],
)
def test_the_benchmark_trains_what_fit_trains(tmp_path: Path, name: str) -> None:
    spec = RunSpec(name, 3e-4, 5)
    cli = TreeGRPOCLI(args=["fit", *run_args(spec), "--max_iterations", "1", "--trainer.default_root_dir", str(tmp_path),
                            "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
                            "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"])  # fmt: skip
    fitted = cli.model
    bench = train(spec, Protocol(budget=1.0, evaluations=1, eval_seeds=1))  # stops after its first iteration
    assert fitted.iteration == bench.module.iteration == 1 and len(bench.run.iterations) == 1
    first = bench.run.iterations[0]
    assert first["loss"] == float(cli.trainer.callback_metrics["loss"])
    assert first["units"] == float(cli.trainer.callback_metrics["compute/units"]) > 0
    steps = {"treegrpo": 2, "dancegrpo": 3, "treegrpo_official": 2, "branchgrpo_official": 8}  # 752 edges / 96
    steps.update({"treegrpo_parent_relative": 2, "treegrpo_tmpo": 2, "treegrpo_mix_updates": 4})
    assert first["optimizer_steps"] == cli.trainer.global_step == steps[name]
    mine, theirs = list(bench.module.adapter.trainable_parameters()), list(fitted.adapter.trainable_parameters())
    assert len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs))


@pytest.mark.slow  # the whole quick protocol: 15 runs, the timing, the report (~5 min on 2 free cores)
def test_the_quick_comparison_writes_the_protocols_schema_and_tables_of_its_numbers(tmp_path: Path, capsys) -> None:
    import json

    import compare_methods

    results = compare_methods.main(["--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert results == saved and saved["complete"] and not saved["missing"]
    protocol = saved["protocol"]
    assert protocol["budget_axis"] == "compute" and protocol["budget"] == 15_000
    assert not set(protocol["sweep_seeds"]) & set(protocol["reported_seeds"])
    assert set(saved["methods"]) == set(HEADLINE) and len(saved["pairs"]) == 10
    for m in saved["methods"].values():
        assert m["n"] == 2 and m["final"]["lo"] <= m["final"]["mean"] <= m["final"]["hi"]
        assert {"best_flat", "dancegrpo"} == set(m["compute_to_target"])
        # every run spent its budget, counted by the module (compute/units_total), not by the benchmark
        assert all(c[-1]["units"] >= 15_000 for c in m["curves"])
    tree = saved["methods"]["treegrpo"]["per_iteration"]
    assert tree["trained"] == 8 * 13 and tree["units"] == tree["sampling"] + 3 * tree["trained"]
    assert saved["methods"]["flowgrpo"]["per_iteration"]["reference"] == 8 * 27 * 8  # the KL's forwards
    assert set(saved["timing"]["methods"]) == set(HEADLINE) and saved["environment"]["torch"]
    for name in ("reward_vs_compute.png", "reward_vs_nfe.png"):
        assert (tmp_path / name).stat().st_size > 1000
    from compare import report

    assert (tmp_path / "report.md").read_text() == report.tables(saved) + "\n"  # formatted from the JSON
    assert saved["headline"] in capsys.readouterr().out


def test_the_design_is_one_of_the_fixed_protocols(capsys) -> None:
    import compare_methods
    from compare import plan

    assert plan.DESIGNS[compare_methods.parse(["--out", "x", "--report"]).design] is plan.FULL
    with pytest.raises(SystemExit):
        compare_methods.parse(["--out", "x", "--report", "--design", "999k"])
    err = capsys.readouterr().err  # argparse quotes the choices differently across Python versions
    assert "--design: invalid choice: '999k'" in err and "540k" in err and "300k" in err


def test_a_stop_file_ends_the_workers_between_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    """`touch OUT/runs/STOP` ends `--work` after the run in hand: the queue logic is what is tested,
    so training is replaced by a record of which runs were asked for."""
    import compare_methods
    from compare import plan
    from compare.runs import RunCache

    cache = RunCache(tmp_path, plan.QUICK.protocol)
    trained: list[str] = []

    def get(spec: RunSpec, **_) -> None:
        if trained:
            raise AssertionError(f"a run started after STOP: {spec.key}")  # (nothing is saved: it would loop)
        trained.append(spec.key)
        (cache.folder / compare_methods.STOP).touch()  # the user asks for a stop while this run trains

    monkeypatch.setattr(cache, "get", get)
    compare_methods.work(cache, plan.QUICK, poll=0.0)
    assert len(trained) == 1  # the run in hand finished; no further run started
    assert "STOP exists: stopping before the next run" in capsys.readouterr().out
    compare_methods.work(cache, plan.QUICK, poll=0.0)  # a new worker while the file is there: no run
    assert len(trained) == 1
    assert not list(cache.folder.glob("*.claim"))  # the finished run's claim was released


def test_a_waiting_worker_plans_once_and_still_takes_over_a_dead_process_run(tmp_path: Path, monkeypatch) -> None:
    """Planning reads every record, so a worker that waits on other processes' runs re-plans only
    when a record changes (`RunCache.records_stamp`: claims do not count); it keeps retrying its
    claims meanwhile, so the run of a process that dies is still taken over."""
    import subprocess

    import compare_methods
    from compare import plan
    from compare.runs import RunCache

    cache = RunCache(tmp_path, plan.QUICK.protocol)
    cache.folder.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])
    plans, polls, trained = [], [], []
    jobs = plan.jobs

    def counted_jobs(*args, **kwargs):
        plans.append(1)
        return jobs(*args, **kwargs)

    def sleep(_: float) -> None:
        polls.append(1)
        if len(polls) == 3:  # the other process dies while this one waits
            other.kill()
            other.wait()

    def get(spec: RunSpec, **_) -> None:
        trained.append(spec.key)
        (cache.folder / compare_methods.STOP).touch()

    try:
        for spec in plan.jobs(cache, plan.QUICK):
            cache.path(spec).with_suffix(".claim").write_text(str(other.pid))
        monkeypatch.setattr(plan, "jobs", counted_jobs)
        monkeypatch.setattr(compare_methods.time, "sleep", sleep)
        monkeypatch.setattr(cache, "get", get)
        compare_methods.work(cache, plan.QUICK, poll=0.0)
    finally:
        other.kill()
        other.wait()
    assert len(polls) == 3 and len(plans) == 1  # three polls, one plan
    assert len(trained) == 1  # the dead process's run, taken over without a new plan
    stamp = cache.records_stamp()
    (cache.folder / "a.claim").write_text("1")
    assert cache.records_stamp() == stamp  # a claim is not a record
    (cache.folder / "a.json").write_text("{}")
    assert cache.records_stamp() != stamp  # a new record is


def test_without_wait_a_worker_ends_when_the_runs_left_are_other_live_processes(tmp_path: Path, capsys) -> None:
    """`--work --no-wait` ends, instead of polling, once every pending run is claimed by a live process
    (here a `sleep`), so that a script's next stage starts at once; by default it keeps waiting."""
    import subprocess

    import compare_methods
    from compare import plan
    from compare.runs import RunCache

    cache = RunCache(tmp_path, plan.QUICK.protocol)
    cache.folder.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        pending = plan.jobs(cache, plan.QUICK)
        for spec in pending:
            cache.path(spec).with_suffix(".claim").write_text(str(other.pid))
        compare_methods.work(cache, plan.QUICK, poll=0.0, wait=False)
        assert f"the {len(pending)} runs left are other processes': ending (--no-wait)" in capsys.readouterr().out
        assert compare_methods.parse(["--out", str(tmp_path), "--work", "--no-wait"]).no_wait

        class Waited(Exception):
            pass

        def sleep(_: float) -> None:
            raise Waited

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(compare_methods.time, "sleep", sleep)
            with pytest.raises(Waited):
                compare_methods.work(cache, plan.QUICK, poll=0.0)
    finally:
        other.kill()
        other.wait()
