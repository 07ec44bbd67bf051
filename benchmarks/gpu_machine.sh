#!/usr/bin/env bash
# benchmarks/gpu_sd35.py on a GPU machine that reaches no package registry, in one command from the
# repository root: installs the carried wheels (.whl/, filled by benchmarks/gpu_wheels.sh) into a
# venv over the image's own packages (torch, lightning, peft, transformers), prints what it runs on,
# and runs the benchmark bounded to MAX_SECONDS (default 360: about 7 minutes in all with the
# start-up). Results: $OUT/gpu_sd35.json (or ./gpu_sd35.json) and the table on stdout: seconds per
# TreeGRPO.step and peak GPU memory of TreeGRPO vs DanceGRPO, with LoRA and fully fine-tuned.
#
#     bash benchmarks/gpu_machine.sh [extra gpu_sd35.py options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
# the image's packages stay as they are; what it lacks goes into a venv over them, from .whl/ only
# (a Python that runs in a venv already: into that one; no venv module: the user's site-packages)
VENV="${TMPDIR:-/tmp}/lit_treegrpo_gpu_venv"
if "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  "$PY" -m pip install -q --no-index --find-links .whl diffusers
elif "$PY" -m venv --system-site-packages "$VENV" 2>/dev/null; then
  PY="$VENV/bin/python"
  "$PY" -m pip install -q --no-index --find-links .whl diffusers
else
  PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --user --no-index --find-links .whl diffusers
fi
"$PY" - <<'PY'
import importlib.metadata as md, platform, torch
names = ("torch", "diffusers", "transformers", "huggingface_hub", "peft", "lightning", "safetensors", "Pillow")
print("python", platform.python_version(), "| cuda", torch.version.cuda, "|",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU", "|",
      ", ".join(f"{n} {md.version(n)}" for n in names))
PY
PYTHONPATH=. "$PY" benchmarks/gpu_sd35.py --max-seconds "${MAX_SECONDS:-360}" \
  --json "${OUT:-.}/gpu_sd35.json" "$@"
