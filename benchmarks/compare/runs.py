"""One run of the comparison, trained until it has spent its compute budget, and the on-disk cache
and job queue that let several processes share the runs and an interrupted benchmark resume.

A run's record (``<out>/runs/<method>_lr<lr>_seed<seed>.json``) holds every iteration's counted
work (the module's own ``compute/*`` metrics), phase times and training reward, and the held-out
curve: the mean ShapesReward of deterministic samples of the held-out prompts (never trained on) x
the evaluation seeds, the same noises for every method, at iteration 0 and each time the run's
compute crosses a multiple of ``budget / evaluations``, and at the end.

Next to it, ``<key>.ckpt`` holds the run's trainable state where it stopped (Lightning's checkpoint:
LoRA weights, optimizer, iteration, data order, generators). When the protocol's budget grows and its
evaluation spacing stays, a cached run is *extended* from that checkpoint instead of trained again:
resuming is exact, so the extended record equals the record of a run trained straight to the new
budget (tested), and a longer budget costs only the added units. The checkpoints stay out of git; a
run without one is trained from the start.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lit_treegrpo.common import reads
from lit_treegrpo.common.files import MiB, read_text_limited
from lit_treegrpo.common.reads import kind_of

from .methods import RunSpec, build, resolved_config, training_identity

COMPUTE_KINDS = ("sampling", "trained", "reference", "reward_images")
#: the largest run record read (a 750k run's is about 0.2 MB)
MAX_RECORD_BYTES = 64 * MiB
#: what every run record holds
RECORD_KEYS = ("identity", "spec", "config", "iterations", "curve")
#: the most of a claim read: a process id
CLAIM_BYTES = 64
#: how long a claim that names no process may be a live one's: its writer creates it, then writes its PID
CLAIM_GRACE_S = 10.0


class InputError(ValueError):
    """An option or file the benchmark cannot use: one line naming it and the fix."""


class RunRecordError(InputError):
    """A run record that cannot be read: one line naming the file and what to do."""


def regular_file(path: Path, what: str, fix: str, error: type[InputError] = InputError) -> bool:
    """Whether ``path`` is a regular file (False: nothing is there), told by its status, never by opening it
    (the package's :func:`~lit_treegrpo.common.reads.regular_file`): ``error`` names the path, ``what`` belongs there
    and ``fix`` when something else is there, or its status cannot be read."""
    try:
        return reads.regular_file(path, what, fix, error=error)
    except OSError as err:  # a parent that is a file, no permission, a loop of links
        raise error(f"{path}: cannot be read ({err.strerror}); {fix}") from None


def read_record(path: Path) -> dict[str, Any]:
    """The run record at ``path``, checked: a regular file, bounded in size, JSON, an object with every
    key of :data:`RECORD_KEYS` and a ``spec`` naming a run; :class:`RunRecordError` naming the file
    otherwise (a record cut short by a full disk, emptied, or written by hand, or a FIFO in its place)."""
    fix = "delete it to train that run again"
    if not regular_file(path, "a run record", fix, RunRecordError):
        raise RunRecordError(f"{path}: no such run record; {fix}")  # gone since the folder was listed
    try:
        saved = json.loads(read_text_limited(path, MAX_RECORD_BYTES, "run record"))
    except json.JSONDecodeError as err:
        raise RunRecordError(
            f"{path}: not a run record (invalid JSON: {err.msg} at line {err.lineno}, column {err.colno}); {fix}"
        ) from None
    except ValueError as err:  # too large, or not UTF-8
        raise RunRecordError(f"{err}; {fix}") from None
    except OSError as err:  # unreadable
        raise RunRecordError(f"{path}: cannot be read ({err.strerror}); {fix}") from None
    if not isinstance(saved, dict):
        raise RunRecordError(f"{path}: not a run record (a JSON {type(saved).__name__}, not an object); {fix}")
    missing = [key for key in RECORD_KEYS if key not in saved]
    if missing:
        raise RunRecordError(f"{path}: not a complete run record (no {', '.join(map(repr, missing))}); {fix}")
    spec = saved["spec"]
    if not isinstance(spec, dict) or set(spec) != {f.name for f in dataclass_fields(RunSpec)}:
        raise RunRecordError(f"{path}: not a run record (its 'spec' is {spec!r:.80}, not a run's); {fix}")
    kinds = {"identity": dict, "config": dict, "iterations": list, "curve": list}
    wrong = [key for key, kind in kinds.items() if not isinstance(saved[key], kind)]
    if wrong:
        raise RunRecordError(
            f"{path}: not a run record (its {wrong[0]!r} is a {type(saved[wrong[0]]).__name__}); {fix}"
        )
    return saved


@dataclass(frozen=True)
class Protocol:
    """What makes runs comparable; a cached run with another protocol is trained again."""

    budget: float = 300_000.0
    """Compute units per run (module's ``compute/units_total``)."""
    evaluations: int = 10
    """Held-out evaluations spread over the budget (besides the one at iteration 0)."""
    eval_seeds: int = 8
    """Samples per held-out prompt (seeds 0 .. eval_seeds - 1)."""
    batch_size: int = 8
    """Prompts per iteration (configs/shapes.yaml's)."""
    max_iterations: int = 100_000
    """Safety cap on iterations per run."""

    @property
    def every(self) -> float:
        """Compute units between held-out evaluations."""
        return self.budget / self.evaluations

    def extends(self, shorter: Protocol) -> bool:
        """Whether a run under ``shorter`` is the start of a run under this protocol: a smaller budget,
        everything else (evaluation spacing, noises, batch) the same."""
        same = {**asdict(shorter), "budget": self.budget, "evaluations": self.evaluations}
        return shorter.budget < self.budget and same == asdict(self) and shorter.every == self.every


@dataclass
class Run:
    """What one run recorded."""

    iterations: list[dict[str, float]] = field(default_factory=list)
    curve: list[dict[str, float]] = field(default_factory=list)


class Recorder:
    """Records each training step, evaluates on the held-out prompts, stops the run at its budget."""

    def __init__(
        self,
        module: Any,
        prompts: list[str],
        protocol: Protocol,
        *,
        start: Run | None = None,
        seconds: float = 0.0,
        checkpoint: Path | None = None,
    ) -> None:
        import lightning.pytorch as pl

        self.module, self.prompts, self.protocol = module, prompts, protocol
        # an extended run goes on from the record of its shorter run (evaluations included)
        self.run = Run(list(start.iterations), list(start.curve)) if start else Run()
        self.seconds = seconds
        self.checkpoint = checkpoint
        units = self.run.iterations[-1]["units_total"] if self.run.iterations else 0.0
        self.next_eval = self._after(units)
        recorder = self

        class _Callback(pl.Callback):
            def on_train_start(self, trainer, pl_module):
                if not recorder.run.curve:  # a resumed run has its iteration-0 evaluation already
                    recorder.evaluate()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                recorder.step(trainer)

        self.callback = _Callback()

    def _after(self, units: float) -> float:
        """The first evaluation point past ``units`` (a multiple of the protocol's spacing)."""
        return self.protocol.every * (math.floor(units / self.protocol.every) + 1)

    def step(self, trainer: Any) -> None:
        m = {k: float(v) for k, v in trainer.callback_metrics.items()}
        laps = {k: m[f"time/{k}_s"] for k in ("rollout", "reward", "advantages", "train")}
        self.seconds += sum(laps.values())
        record = {
            **{k: m[f"compute/{k}"] for k in COMPUTE_KINDS},
            "units": m["compute/units"],
            "units_total": m["compute/units_total"],
            **{f"{k}_s": v for k, v in laps.items()},
            "reward": m.get("reward", math.nan),
            "loss": m.get("loss", math.nan),
            "optimizer_steps": m["optimizer_steps"],
        }
        self.run.iterations.append(record)
        done = record["units_total"] >= self.protocol.budget or len(self.run.iterations) >= self.protocol.max_iterations
        if record["units_total"] >= self.next_eval or done:
            self.evaluate()
            self.next_eval = self._after(record["units_total"])
        if done:
            trainer.should_stop = True
            if self.checkpoint is not None:
                # saved where Lightning's own ModelCheckpoint saves (after the batch), so that a
                # fit resumed from it goes on with the next batch, as an unbroken run would
                trainer.save_checkpoint(self.checkpoint)

    @torch.no_grad()
    def evaluate(self) -> None:
        seeds = range(self.protocol.eval_seeds)
        images = torch.cat([self.module.sample(self.prompts, seed) for seed in seeds])  # [S * P, 3, H, W]
        scores, measures = held_out_scores(images, self.prompts, len(seeds))  # [S, P]
        per_seed = scores.mean(dim=1)  # [S] each evaluation seed's mean over the prompts
        reward = float(scores.mean())
        last = self.run.iterations[-1] if self.run.iterations else None
        totals = {k: sum(i[k] for i in self.run.iterations) for k in COMPUTE_KINDS}
        self.run.curve.append(
            {
                "iteration": len(self.run.iterations),
                "units": last["units_total"] if last else 0.0,
                "sampling_nfe": totals["sampling"],
                **{f"{k}_total": v for k, v in totals.items() if k != "sampling"},
                "optimizer_steps": last["optimizer_steps"] if last else 0.0,
                "seconds": self.seconds,
                "reward": reward,
                # the evaluation's own noise: how much re-drawing the evaluation seeds would move `reward`
                "reward_se": float(per_seed.std() / len(seeds) ** 0.5) if len(seeds) > 1 else 0.0,
                "reward_per_seed": per_seed.tolist(),
                **measures,
            }
        )


def held_out_scores(images: Tensor, prompts: list[str], samples: int) -> tuple[Tensor, dict[str, Any]]:
    """The ShapesReward [S, P] of an evaluation's ``images`` [S * P, 3, H, W] (seed-major: sample s of prompt p is
    row s * P + p), and what it says beside the total: the mean of each factor of the score (``parts``:
    presence, purity, shape, size, position; colour is presence and purity), and the samples' spread per prompt,
    averaged over the prompts, in pixels (``diversity_pixels``, the RMS distance of two images in [0, 1]) and in
    what they depict (``diversity_attributes``: :func:`~lit_treegrpo.shapes.reward.attributes`, the fitted
    shape's place, size, template fit and colour, each in [0, 1])."""
    from lit_treegrpo.core.diversity import spread_per_prompt
    from lit_treegrpo.shapes.reward import FACTORS, ShapesReward, attributes

    analysis = ShapesReward().analyse(images, prompts * samples)
    scores = analysis.score.view(samples, len(prompts))  # [S, P]
    pixels = images.flatten(1).view(samples, len(prompts), -1)  # [S, P, 3 H W]
    described = attributes(analysis, images.shape[-1]).view(samples, len(prompts), -1)  # [S, P, 8]
    measures: dict[str, Any] = {
        "parts": {name: float(analysis[i].float().mean()) for name, i in FACTORS.items()},
        "diversity_pixels": float(spread_per_prompt(pixels).mean()) if samples > 1 else None,
        "diversity_attributes": float(spread_per_prompt(described).mean()) if samples > 1 else None,
    }
    return scores, measures


class Trained(NamedTuple):
    run: Run
    record: dict[str, Any]  # the fit arguments and the resolved configuration
    module: Any  # the trained TreeGRPOModule


class Start(NamedTuple):
    """Where an extended run starts: its shorter run's record and checkpoint."""

    run: Run
    seconds: float
    checkpoint: Path


def train(spec: RunSpec, protocol: Protocol, *, start: Start | None = None, checkpoint: Path | None = None) -> Trained:
    """Train ``spec`` from the shipped weights (or go on from ``start``) until it has spent
    ``protocol.budget`` units; save its state at the end to ``checkpoint`` when given."""
    from lightning.pytorch import Trainer

    with tempfile.TemporaryDirectory() as root:
        module, data, callbacks, record = build(spec, Path(root))
        if data.batch_size != protocol.batch_size:
            raise ValueError(f"the task config's batch size is {data.batch_size}, the protocol's {protocol.batch_size}")
        data.setup("fit")
        recorder = Recorder(
            module,
            list(data.val_set.prompts),
            protocol,
            start=start.run if start else None,
            seconds=start.seconds if start else 0.0,
            checkpoint=checkpoint,
        )
        trainer = Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=-1,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[*callbacks, recorder.callback],
        )
        trainer.fit(module, data, ckpt_path=start.checkpoint if start else None)
    return Trained(recorder.run, record, module)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _modified(path: Path) -> int:
    """``path``'s modification time in ns; -1 for a link to nothing (refused when the plan reads it)."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return -1


class RunCache:
    """Finished runs under ``<out>/runs``, and claims that keep two processes off the same run."""

    def __init__(self, out: Path, protocol: Protocol, *, shorter: Iterable[Path] = ()) -> None:
        self.folder = out / "runs"
        self.protocol = protocol
        # other comparisons' folders whose runs this one may extend (the ceilings extend the 750k runs)
        self.shorter = [RunCache(folder, protocol) for folder in shorter]
        self._identities: dict[str, dict[str, Any]] = {}

    def path(self, spec: RunSpec) -> Path:
        return self.folder / f"{spec.key}.json"

    def checkpoint(self, spec: RunSpec) -> Path:
        """The run's state where it stopped, for extending it to a longer budget."""
        return self.folder / f"{spec.key}.ckpt"

    def identity(self, spec: RunSpec) -> dict[str, Any]:
        """What the files would train for ``spec`` now (:func:`~.methods.training_identity`), per
        method (its rate and seed are in the run's name), worked out once per process."""
        if spec.method not in self._identities:
            self._identities[spec.method] = training_identity(resolved_config(spec))
        return self._identities[spec.method]

    def _saved(self, spec: RunSpec) -> dict[str, Any] | None:
        """The record of ``spec`` on disk, if its recorded configuration trains what the current
        files train (whatever protocol it ran under)."""
        path = self.path(spec)
        if not regular_file(path, "a run record", "delete it to train that run again", RunRecordError):
            return None
        saved = read_record(path)
        return saved if self._trains_now(spec, saved) else None

    def _trains_now(self, spec: RunSpec, saved: dict[str, Any]) -> bool:
        """Whether a record's configuration trains what the current files train for ``spec``."""
        return training_identity(saved["config"]) == self.identity(spec)

    def records_stamp(self) -> frozenset[tuple[str, int]]:
        """Each run record's name with its modification time: a plan, which reads the records,
        can only change when this does (claims are not records)."""
        if not self.folder.is_dir():
            return frozenset()
        return frozenset((path.name, _modified(path)) for path in self.folder.glob("*.json"))

    def protocols(self) -> list[dict[str, Any]]:
        """The protocol of every run record in the folder (read and checked, :func:`read_record`)."""
        found = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            protocol = read_record(path)["identity"].get("protocol")
            if isinstance(protocol, dict):
                found.append(protocol)
        return found

    def _ran_here(self, saved: dict[str, Any]) -> bool:
        """Whether a record ran under this protocol."""
        return saved.get("identity", {}).get("protocol") == asdict(self.protocol)

    def load(self, spec: RunSpec) -> Run | None:
        """The cached run of ``spec``, if it ran under this protocol and its recorded configuration
        trains what the current files train."""
        saved = self._saved(spec)
        if saved is None or not self._ran_here(saved):
            return None
        return Run(saved["iterations"], saved["curve"])

    def finished(self) -> Iterator[tuple[RunSpec, dict[str, Any]]]:
        """Every run in the folder that :meth:`load` would return (a moved grid's rates too), with
        its whole record, each file read once."""
        for path in sorted(self.folder.glob("*.json")):
            saved = read_record(path)
            spec = RunSpec(**saved["spec"])
            if path == self.path(spec) and self._ran_here(saved) and self._trains_now(spec, saved):
                yield spec, saved

    def start(self, spec: RunSpec) -> Start | None:
        """The cached shorter run of ``spec`` that this protocol extends, when its checkpoint is
        here or in one of the :attr:`shorter` folders (this folder first)."""
        for cache in (self, *self.shorter):
            found = cache._shorter_run(spec, self.protocol)
            if found is not None:
                return found
        return None

    def _shorter_run(self, spec: RunSpec, longer: Protocol) -> Start | None:
        """This folder's run of ``spec`` that ``longer`` extends, with the checkpoint it ended with."""
        checkpoint = self.checkpoint(spec)
        saved = self._saved(spec) if checkpoint.is_file() else None
        if saved is None:
            return None
        fields = saved.get("identity", {}).get("protocol", {})
        if set(fields) != {f.name for f in dataclass_fields(Protocol)} or not longer.extends(Protocol(**fields)):
            return None
        if saved.get("checkpoint_sha256") != sha256(checkpoint):
            return None  # the checkpoint is not the one this record ended with (an interrupted save)
        return Start(Run(saved["iterations"], saved["curve"]), saved["seconds"], checkpoint)

    def get(self, spec: RunSpec, *, train_missing: bool = True) -> Run | None:
        """The cached run, or (``train_missing``) a new one trained now and saved."""
        run = self.load(spec)
        if run is not None or not train_missing:
            return run
        started = time.perf_counter()
        start = self.start(spec)
        self.folder.mkdir(parents=True, exist_ok=True)
        checkpoint = self.checkpoint(spec).with_suffix(f".ckpt-tmp{os.getpid()}")
        try:
            run, record, _ = train(spec, self.protocol, start=start, checkpoint=checkpoint)
        except BaseException:
            checkpoint.unlink(missing_ok=True)  # a failed run leaves no half state behind
            raise
        tmp = self.path(spec).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(
            json.dumps(
                {
                    "identity": {"protocol": asdict(self.protocol)},
                    "spec": asdict(spec),
                    "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "checkpoint_sha256": sha256(checkpoint),
                    # an extended run's seconds include its shorter run's
                    "seconds": (start.seconds if start else 0.0) + time.perf_counter() - started,
                    **record,
                    "iterations": run.iterations,
                    "curve": run.curve,
                }
            )
        )
        checkpoint.replace(self.checkpoint(spec))
        tmp.replace(self.path(spec))  # never a half-written record
        first, last = run.curve[0], run.curve[-1]
        how = f"extended from {len(start.run.iterations)} iterations, " if start else ""
        print(
            f"{spec.key}: {how}{len(run.iterations)} iterations, {last['units']:.0f} units, held-out reward "
            f"{first['reward']:.3f} -> {last['reward']:.3f} in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        return run

    def claim_path(self, spec: RunSpec) -> Path:
        """Where a process that trains ``spec`` writes its PID."""
        return self.path(spec).with_suffix(".claim")

    def claim(self, spec: RunSpec) -> bool:
        """Take ``spec`` for this process (False: done, or another live process has it). A claim that
        names no live process (its process died; or it is empty, unreadable or garbage, and older than
        :data:`CLAIM_GRACE_S`) is stale: it is removed and the run taken."""
        if self.load(spec) is not None:
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        claim = self.claim_path(spec)
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            if self._held(claim):
                return False
            try:
                claim.unlink(missing_ok=True)  # a stale claim
            except OSError as err:
                raise InputError(
                    f"{claim}: a stale claim this process cannot remove ({err.strerror}); remove it, "
                    "or give --out a folder it can write"
                ) from None
            return self.claim(spec)
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True

    @staticmethod
    def _claimer(claim: Path) -> tuple[int | None, float] | None:
        """The PID a claim names (None: it names none) and its age in seconds; None when there is no
        claim. A claim is what :meth:`claim` writes, a regular file: anything else in its place is
        refused (a FIFO would block the read), told by its status without opening it."""
        fix = "remove it (a --work process then takes the run)"
        try:
            status = os.lstat(claim)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(status.st_mode):
            raise InputError(f"{claim} is {kind_of(status.st_mode)}, not a claim (a regular file); {fix}")
        age = time.time() - status.st_mtime
        try:
            # never blocks even if a FIFO took its place since the lstat
            fd = os.open(claim, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:  # unreadable: names no process
            return None, age
        try:
            text = os.read(fd, CLAIM_BYTES).decode("ascii", "replace").strip()
        except OSError:
            return None, age
        finally:
            os.close(fd)
        pid = int(text) if text.isascii() and text.isdigit() else 0
        return (pid if pid > 0 else None), age  # 0 would name every process of this group to os.kill

    def _held(self, claim: Path) -> bool:
        """Whether ``claim`` keeps the run from this process: a live process's (or one that may still
        be writing its PID), as opposed to a stale one."""
        found = self._claimer(claim)
        if found is None:
            return False  # gone meanwhile: take the run
        pid, age = found
        if pid is None:
            return age < CLAIM_GRACE_S  # its writer may be between creating it and writing its PID
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, OverflowError):  # dead, or no process id at all
            return False
        except PermissionError:  # another user's live process
            return True
        return True

    def release(self, spec: RunSpec) -> None:
        """Drop this process's claim on ``spec`` (never another process's, nor anything else in its place)."""
        claim = self.claim_path(spec)
        try:
            found = self._claimer(claim)
        except InputError:  # not a claim: not this process's
            return
        if found is not None and found[0] == os.getpid():
            claim.unlink(missing_ok=True)

    def work(self, specs: Iterable[RunSpec]) -> Iterator[RunSpec]:
        """Train each of ``specs`` that no other process has taken; yields the specs it trained."""
        for spec in specs:
            if not self.claim(spec):
                continue
            try:
                self.get(spec)
            finally:
                self.release(spec)
            yield spec


def timing(specs: list[RunSpec], *, rounds: int = 3, iterations: int = 3) -> dict[str, Any]:
    """Seconds per compute unit of each run in ``specs``, measured side by side in this process:
    ``rounds`` rounds, each training every spec for one warm-up iteration and ``iterations`` timed
    ones (the phase times the module logs, evaluation excluded), so that drift of the machine's
    speed falls on every method alike."""
    totals: dict[str, dict[str, float]] = {}
    per_round: dict[str, list[float]] = {}  # each round's seconds per iteration, for an interval over rounds
    protocol = Protocol(budget=math.inf, evaluations=1, eval_seeds=1, max_iterations=iterations + 1)
    for _ in range(rounds):
        for spec in specs:
            run = train(spec, protocol).run
            timed = run.iterations[1:]
            per_round.setdefault(spec.method, []).append(
                sum(i["rollout_s"] + i["reward_s"] + i["advantages_s"] + i["train_s"] for i in timed) / len(timed)
            )
            t = totals.setdefault(
                spec.method,
                {
                    k: 0.0
                    for k in (
                        "seconds",
                        "units",
                        "iterations",
                        "rollout_s",
                        "train_s",
                        "sampling",
                        "trained",
                        "reference",
                    )
                },
            )
            for i in run.iterations[1:]:
                t["seconds"] += i["rollout_s"] + i["reward_s"] + i["advantages_s"] + i["train_s"]
                t["units"] += i["units"]
                t["iterations"] += 1
                for k in ("rollout_s", "train_s", "sampling", "trained", "reference"):
                    t[k] += i[k]
    methods = {}
    for name, t in totals.items():
        sampling = t["rollout_s"] / t["sampling"]
        # the training pass's time per forward it ran, the reference's no-grad ones counted at one unit
        trained = (t["train_s"] - sampling * t["reference"]) / t["trained"] if t["trained"] else math.nan
        methods[name] = {
            "seconds_per_unit": t["seconds"] / t["units"],
            "units_per_iteration": t["units"] / t["iterations"],
            "seconds_per_iteration": t["seconds"] / t["iterations"],
            "seconds_per_sampling_forward": sampling,
            "seconds_per_trained_forward": trained,
            "trained_forward_in_sampling_forwards": trained / sampling,
            "rounds_seconds_per_iteration": per_round[name],
        }
    return {"rounds": rounds, "iterations": iterations, "methods": methods}
