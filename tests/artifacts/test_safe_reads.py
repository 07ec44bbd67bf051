"""A checkpoint a user hands over is read once, with torch's safe unpickler: a hostile pickle is
refused in one line naming the refused global (never with torch's advice to re-run with
``weights_only=False``) and none of its code runs, and a checkpoint swapped for a hostile one after
it was verified is never read: export, validate, predict and a resumed fit use what was verified."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_treegrpo.artifacts.checkpoint import (
    AtomicCheckpointIO,
    CorruptCheckpointError,
    guard_strategy_load,
    read_checkpoint,
)
from tests.cli.test_cli import QUIET, TINY, _main_error

EMA = """\
trainer:
  callbacks:
    - class_path: lit_treegrpo.callbacks.EMA
      init_args: {decay: 0.5}
"""


class WriteMarker:
    """Unpickled by an unsafe loader, runs Python code that writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('code ran')",)


class ShellMarker(WriteMarker):
    """Unpickled by an unsafe loader, runs a shell command that creates ``marker``."""

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch '{self.marker}'",)


def hostile_checkpoint(path: Path, marker: Path, payload: type = WriteMarker) -> Path:
    """A Lightning-shaped checkpoint whose ``lit_treegrpo`` entry runs code when unpickled unsafely."""
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6", "lit_treegrpo": payload(marker)}, path)
    return path


@pytest.mark.parametrize(
    ("payload", "refused"), [(WriteMarker, "builtins.exec"), (ShellMarker, os.system.__module__ + ".system")]
)
def test_a_hostile_checkpoint_is_refused_naming_the_global_and_runs_nothing(
    tmp_path: Path, payload: type, refused: str
) -> None:
    marker = tmp_path / "marker"
    path = hostile_checkpoint(tmp_path / "hostile.ckpt", marker, payload)
    torch.load(path, weights_only=False)  # the payload is live: an unsafe load runs it
    assert marker.is_file()
    marker.unlink()
    with pytest.raises(CorruptCheckpointError) as refusal:
        read_checkpoint(path)
    message = str(refusal.value)
    assert message == (
        f"--ckpt_path: {path} holds objects that the safe unpickler refuses (the global {refused}); it was not written "
        "by this project's fit and may be hostile, so it is not loaded: pass a checkpoint written by fit "
        "(<root>/checkpoints/last.ckpt), or last"
    )
    assert "weights_only" not in message and refusal.value.__cause__ is None and refusal.value.__suppress_context__
    assert not marker.exists()


def test_before_torch_2_5_the_refused_global_is_read_from_the_refusal_in_either_wording(
    tmp_path: Path, monkeypatch
) -> None:
    from lit_treegrpo.artifacts.checkpoint import refused_globals

    marker = tmp_path / "marker"
    path = hostile_checkpoint(tmp_path / "hostile.ckpt", marker)
    monkeypatch.delattr(torch.serialization, "get_unsafe_globals_in_checkpoint")  # as in torch 2.4
    # this torch's own wording (which names builtins without their module)
    with pytest.raises(CorruptCheckpointError, match=r"\(the global exec\); it was not written by this project's fit"):
        read_checkpoint(path)
    wordings = {  # the two wordings of torch 2.13: a global missing from the allowlist, a blocked module
        "posix.system": "Weights only load failed. ...\n\tWeightsUnpickler error: Unsupported global: GLOBAL posix.system "
        "was not an allowed global by default. Please use ...",
        "nt.system": "Weights only load failed. ...\n\n\nTrying to load unsupported GLOBAL nt.system whose module nt is blocked.",
    }
    for name, wording in wordings.items():
        assert refused_globals(None, pickle.UnpicklingError(wording)) == [name]
    assert not marker.exists()


def test_torchs_advice_to_load_unsafely_never_reaches_the_message() -> None:
    from lit_treegrpo.artifacts.checkpoint import _without_advice

    err = RuntimeError(
        "Cannot use ``weights_only=True`` with TorchScript archives passed to ``torch.load``. In PyTorch "
        "2.6, we changed the default value of the `weights_only` argument in `torch.load` from `False` "
        "to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, but "
        "it can result in arbitrary code execution. Do it only if you got the file from a trusted source."
    )
    assert _without_advice(err) == "RuntimeError from torch's safe loader"
    assert _without_advice(RuntimeError("PytorchStreamReader failed reading zip archive. More text\nsecond")) == (
        "PytorchStreamReader failed reading zip archive. More text"
    )


def test_the_checkpoint_io_loads_weights_only_whatever_it_is_asked(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = hostile_checkpoint(tmp_path / "hostile.ckpt", marker)
    with pytest.raises(CorruptCheckpointError, match=r"\(the global builtins\.exec\)"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)  # what Lightning passes on from the trainer
    assert not marker.exists()
    plugin = AtomicCheckpointIO()
    plugin.save_checkpoint({"step": torch.tensor(1)}, tmp_path / "good.ckpt")
    verified = read_checkpoint(tmp_path / "good.ckpt", lightning=False)
    plugin.preload(tmp_path / "good.ckpt", verified)
    os.replace(path, tmp_path / "good.ckpt")  # swapped after the check: the preloaded copy is handed over
    assert plugin.load_checkpoint(tmp_path / "good.ckpt") is verified
    with pytest.raises(CorruptCheckpointError):  # handed over once; a second load reads the file, safely
        plugin.load_checkpoint(tmp_path / "good.ckpt")
    assert not marker.exists()


def test_fsdp_strategys_own_unpickler_is_bypassed(tmp_path: Path) -> None:
    from lightning.pytorch.strategies import FSDPStrategy, fsdp

    marker = tmp_path / "marker"
    path = hostile_checkpoint(tmp_path / "hostile.ckpt", marker)
    fsdp._lazy_load(path)  # Lightning's loader of a full FSDP checkpoint unpickles without restriction
    assert marker.is_file()
    marker.unlink()
    strategy = FSDPStrategy()
    strategy.model = torch.nn.Linear(1, 1)
    strategy._lightning_module = torch.nn.Linear(1, 1)  # what load_checkpoint asserts is there
    strategy.checkpoint_io = AtomicCheckpointIO()
    strategy.checkpoint_io.preload(tmp_path / "other.ckpt", {"state_dict": {}})
    guard_strategy_load(strategy)
    with pytest.raises(CorruptCheckpointError, match=r"\(the global builtins\.exec\)"):
        strategy.load_checkpoint(path, weights_only=False)
    assert not marker.exists()
    assert strategy.checkpoint_io._preloaded is None  # a copy not asked for is not kept for the whole run
    assert fsdp._lazy_load.__name__ == "_lazy_load"  # restored after the load


@pytest.mark.parametrize("command", ["fit", "validate", "predict", "export"])
def test_a_hostile_ckpt_path_is_refused_in_one_line_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model, command: str
) -> None:
    marker = tmp_path / "marker"
    path = hostile_checkpoint(tmp_path / "hostile.ckpt", marker)
    extra = ["--out", str(tmp_path / "out")] if command == "export" else list(QUIET)
    line = _main_error(monkeypatch, capsys, command, "--config", str(TINY), *extra, "--ckpt_path", str(path),
                       "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert line.startswith(
        f"error: --ckpt_path: {path} holds objects that the safe unpickler refuses (the global builtins.exec)"
    )
    assert "weights_only" not in line
    assert not marker.exists()


def test_weights_only_false_is_refused(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    line = _main_error(monkeypatch, capsys, "validate", "--config", str(TINY), *QUIET, "--weights_only", "false",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: --weights_only false: checkpoints are loaded with torch's safe unpickler only"), line


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One training step of the tiny config with an EMA callback: ``checkpoints/last.ckpt``."""
    from lit_treegrpo.cli import main

    root = tmp_path_factory.mktemp("run")
    (root / "ema.yaml").write_text(EMA)
    main(["fit", "--config", str(TINY), "--config", str(root / "ema.yaml"), *QUIET, "--trainer.max_steps", "1",
          "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(root)])  # fmt: skip
    return root


@pytest.mark.parametrize("command", ["fit", "validate", "predict", "export"])
def test_a_checkpoint_swapped_after_it_was_verified_is_never_read(
    run: Path, tmp_path: Path, monkeypatch, command: str
) -> None:
    from lit_treegrpo.cli import app as cli

    root = tmp_path / "run"
    shutil.copytree(run, root)
    last = root / "checkpoints" / "last.ckpt"
    marker = tmp_path / "marker"
    hostile = hostile_checkpoint(tmp_path / "hostile.ckpt", marker)
    verify, swapped = cli.read_checkpoint, []

    def verify_then_swap(path: Path, **kwargs: Any) -> dict[str, Any]:
        checkpoint = verify(path, **kwargs)
        os.replace(hostile, path)  # the file the command was given is now a hostile pickle
        swapped.append(Path(path))
        return checkpoint

    monkeypatch.setattr(cli, "read_checkpoint", verify_then_swap)
    args = [command, "--config", str(TINY), "--trainer.default_root_dir", str(root), "--ckpt_path", "last"]
    if command == "export":
        made = cli.TreeGRPOCLI(args=[*args, "--out", str(tmp_path / "out"), "--ema", "true"])
    else:
        more = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"] if command == "fit" else []
        made = cli.TreeGRPOCLI(args=[*args, *QUIET, *more])
    assert swapped == [last] and not marker.exists()
    if command == "fit":  # resumed from the verified step, and saved the next
        assert made.trainer.global_step == 2
        assert read_checkpoint(made.trainer.checkpoint_callback.last_model_path)["global_step"] == 2
    elif command == "validate":  # the EMA weights found in the verified checkpoint were evaluated
        assert any("validation" in getattr(cb, "apply_on", ()) for cb in made.trainer.callbacks)
        assert "val/reward" in made.trainer.callback_metrics
    elif command == "predict":
        assert any((root / "predictions").iterdir())
    else:
        card = (tmp_path / "out" / "export.json").read_text()
        assert '"iterations": 1' in card and '"num_updates": 1' in card
