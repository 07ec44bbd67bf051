"""Images, GIFs and text reach every configured logger that takes them: Weights & Biases (offline)
and MLflow (a local store), as TensorBoard; the scalars go there too."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from lit_treegrpo.callbacks import RewardMetrics, SampleGridLogger

from .helpers import TRAIN_PROMPTS, StandIn, prompt_loader, trainer


def _wandb_history(run: Path) -> list[dict[str, Any]]:
    """The history rows (``wandb.log`` calls) of an offline run's ``run-*.wandb`` file: W&B's
    record log (LevelDB's log format: 32 KiB blocks of records, each a 7-byte header ``crc32,
    length, type`` and a piece of one protobuf ``Record``), read here because the package ships no
    reader for it."""
    from wandb.proto import wandb_internal_pb2 as pb

    # wandb.finish() can return before W&B's service process has written the file out (seen on a
    # loaded machine): wait for the service's own "all finished"
    log, deadline = run / "logs" / "debug-internal.log", time.monotonic() + 60
    while not (log.is_file() and "stream: all finished" in log.read_text()):
        assert time.monotonic() < deadline, f"W&B's service never finished writing {run}"
        time.sleep(0.1)
    (path,) = run.glob("run-*.wandb")
    data, block, header = path.read_bytes(), 32768, 7
    pos, pieces, rows = header, [], []  # the file starts with a 7-byte header of its own
    while pos + header <= len(data):
        if block - pos % block < header:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        pieces.append(data[pos + header : pos + header + length])
        pos += header + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()
            record.ParseFromString(b"".join(pieces))
            pieces = []
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items})
    return rows


def _fit_with(tmp_path, logger) -> None:
    grid = SampleGridLogger(prompts=TRAIN_PROMPTS[:2], seeds=[0], every_n_steps=2, captions=False)
    fit = trainer(tmp_path, 2, [grid, RewardMetrics()], logger=logger)
    fit.fit(StandIn(), prompt_loader(TRAIN_PROMPTS))


def test_weights_and_biases_offline_gets_the_scalars_and_the_grid(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lit_treegrpo_test")
    try:
        _fit_with(tmp_path, logger)
    finally:
        wandb.finish()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    images = sorted(p.name for p in (run / "files" / "media" / "images").glob("*.png"))
    assert [name.split("_")[0] for name in images] == ["samples"] * 2, images  # iterations 0 and 2
    rows = _wandb_history(run)
    rewards = [(r["trainer/global_step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    assert [step for step, _ in rewards] == [0, 1] and all(0.0 < value < 1.0 for _, value in rewards)
    grids = [r["trainer/global_step"] for r in rows if "samples/filenames" in r]
    assert grids == [0, 2]  # the grid at the iterations of its weights, on the scalars' axis
    assert any("reward/prompts/path" in r for r in rows)  # RewardMetrics' table, as a W&B table


def test_mlflow_with_a_local_store_gets_the_scalars_the_grid_and_the_tables(tmp_path) -> None:
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    store, artifacts = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts")
    logger = MLFlowLogger(experiment_name="lit_treegrpo_test", tracking_uri=store, artifact_location=artifacts)
    _fit_with(tmp_path, logger)
    client, run_id = logger.experiment, logger.run_id
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [0, 1]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert "images" in artifacts, artifacts  # log_image's store: images/<key>+step+<step>+...png
    images = [a.path for a in client.list_artifacts(run_id, "images") if a.path.endswith(".png")]
    assert sorted(p.split("+")[2] for p in images if p.startswith("images/samples+step+")) == ["0", "2"], images
    tables = [a.path for a in client.list_artifacts(run_id, "reward/prompts")]
    assert tables and all(p.endswith(".md") for p in tables), tables  # RewardMetrics' table, a file per step
