"""The main job with another logger, switched on the command line: Weights & Biases offline, and
MLflow with a local store, each record the scalars and the grid and tree images."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.callbacks.test_loggers import _wandb_history

REPO = Path(__file__).resolve().parents[2]
SHAPES = ("--config", str(REPO / "configs" / "shapes.yaml"), "--trainer.max_steps", "2",
          "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false")  # fmt: skip


def _main(*args: str) -> None:
    from lit_treegrpo.cli import main

    main(list(args))


def test_the_main_job_with_wandb_offline_writes_into_its_run_folder(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    root = tmp_path / "run"
    try:
        _main("fit", *SHAPES, "--trainer.default_root_dir", str(root),
              "--trainer.logger", "lightning.pytorch.loggers.WandbLogger", "--trainer.logger.offline", "true")  # fmt: skip
    finally:
        wandb.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    (run,) = (root / "wandb").glob("offline-run-*")
    rows = _wandb_history(run)
    assert [r["trainer/global_step"] for r in rows if "reward" in r] == [0, 1]
    assert [r["trainer/global_step"] for r in rows if "samples/filenames" in r] == [0, 2]
    assert [r["trainer/global_step"] for r in rows if "tree/filenames" in r] == [0, 2]
    images = sorted(p.name.split("_")[0] for p in (run / "files" / "media" / "images").glob("*.png"))
    assert images == ["samples", "samples", "tree", "tree"]


def test_the_main_job_with_mlflow_and_a_local_store(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    # a database store: MLflow's file store cannot hold `reward` beside `reward/mean` (a file and a
    # folder of one name), and MLflow 3 keeps it only for old runs
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _main("fit", *SHAPES, "--trainer.default_root_dir", str(tmp_path / "run"),
          "--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger", "--trainer.logger.tracking_uri", store,
          "--trainer.logger.experiment_name", "shapes")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db", "run"]
    assert (tmp_path / "run" / "mlflow_artifacts").is_dir()  # the images and tables, in the run folder
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("shapes").experiment_id])
    assert run.info.run_name == "run"  # named after the run folder, not a random name
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward")] == [0, 1]
    images = [a.path.split("+") for a in client.list_artifacts(run.info.run_id, "images") if a.path.endswith(".png")]
    assert sorted((p[0], p[2]) for p in images) == [
        ("images/samples", "0"),
        ("images/samples", "2"),
        ("images/tree", "0"),
        ("images/tree", "2"),
    ]
