"""The main job with another logger, switched on the command line: Weights & Biases offline, and
MLflow with a local store, each record the scalars and the grid and tree images; and every logger
(TensorBoard, CSV, W&B, MLflow) keeps the fit's configuration."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    # the configuration: the run's W&B config, and the record in the run folder
    config = _wandb_config(run)
    assert config["model"]["tree"]["branching"] == 3 and config["trainer"]["max_steps"] == 2
    assert yaml.safe_load((root / "config.yaml").read_text())["model"]["tree"]["branching"] == 3


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
    # the configuration: one param per option, and the record file as an artefact
    params = client.get_run(run.info.run_id).data.params
    assert params["model/tree/branching"] == "3" and params["trainer/max_steps"] == "2"
    assert params["trainer/callbacks/0/class_path"] == "lit_treegrpo.callbacks.RewardMetrics"
    assert all(len(v) < 250 for v in params.values())  # nothing cut at MLflow's limit
    record = tmp_path / "run" / "config.yaml"  # the store is a database: the record lies in the run folder
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
    saved = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "download")))
    assert saved.read_text() == record.read_text()
    assert yaml.safe_load(record.read_text())["model"]["tree"]["branching"] == 3


def test_the_main_job_with_csv_keeps_its_configuration(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _main("fit", *SHAPES, "--trainer.default_root_dir", str(root),
          "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(root))  # fmt: skip
    (folder,) = (root / "lightning_logs").iterdir()  # CSV's own folder of the run: version_0
    assert (folder / "metrics.csv").is_file()
    assert yaml.safe_load((folder / "config.yaml").read_text())["model"]["tree"]["branching"] == 3
    hparams = yaml.safe_load((folder / "hparams.yaml").read_text())
    assert hparams["model"]["tree"]["branching"] == 3 and hparams["trainer"]["max_steps"] == 2


def test_the_main_job_with_tensorboard_keeps_its_configuration_and_no_empty_hparams(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _main("fit", *SHAPES, "--trainer.default_root_dir", str(root))
    assert yaml.safe_load((root / "tensorboard" / "config.yaml").read_text())["model"]["tree"]["branching"] == 3
    assert not list(root.rglob("hparams.yaml"))  # Lightning wrote "{}" there: the module logs no hparams


def _wandb_config(run: Path) -> dict[str, Any]:
    """The run config of an offline W&B run, from the config records of its ``run-*.wandb`` file
    (read as :func:`_wandb_history` reads the history, after it has waited for the file)."""
    from wandb.proto import wandb_internal_pb2 as pb

    _wandb_history(run)  # waits for W&B's service to finish writing
    (path,) = run.glob("run-*.wandb")
    data, block, header = path.read_bytes(), 32768, 7
    pos, pieces, config = header, [], {}
    while pos + header <= len(data):
        if block - pos % block < header:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        pieces.append(data[pos + header : pos + header + length])
        pos += header + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            if record.WhichOneof("record_type") == "config":
                for item in record.config.update:
                    config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config
