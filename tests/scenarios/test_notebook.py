"""notebooks/quickstart.ipynb runs top to bottom (a short fit; the real one has more steps)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # executes the whole notebook in a kernel
def test_the_quickstart_notebook_runs_top_to_bottom(tmp_path: Path, monkeypatch) -> None:
    notebook = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
    for key, value in {
        "QUICKSTART_STEPS": "6",
        "QUICKSTART_ROOT": str(tmp_path / "run"),
        "QUICKSTART_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }.items():
        monkeypatch.setenv(key, value)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    text = "\n".join(
        out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "colour accuracy" in text and "held-out reward:" in text
    assert "litlogger" not in text  # no advertisement from the Trainer the notebook builds
    # the base model is scored once, by the fit itself (validate_at_start), not a second time before it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "run" / "tensorboard").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("val/reward")].count(0) == 1
    images = [o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # the base grid, the reward curve, before / after
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
