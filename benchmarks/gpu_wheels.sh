#!/usr/bin/env bash
# The wheels that benchmarks/gpu_sd35.py needs on a GPU machine that reaches no package registry and
# whose image has torch, lightning, peft and transformers but not diffusers (docs/benchmarks.md, "The
# GPU benchmark on a machine without a registry"). Run here, where the registry is reachable; it
# fills .whl/ (git-ignored), which the run carries (carry: [".whl"]; under 64 MiB).
#
# Three diffusers releases, since which one installs depends on the image's huggingface_hub (0.42
# needs hub >= 1.32 and Python >= 3.11, 0.38 hub < 2 and httpx, 0.35 hub >= 0.34; pip picks the
# newest that fits); with what diffusers needs beyond such an image, resolved for CPython 3.10-3.13
# on x86_64 Linux: Pillow, importlib_metadata, requests, httpx and their dependencies.
#
#     bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
PIP="${PIP:-python -m pip}"
for v in 0.42.1 0.38.0 0.35.2; do
  $PIP download -q --no-deps -d .whl "diffusers==$v"
done
for py in 3.10 3.11 3.12 3.13; do
  $PIP download -q -d .whl --only-binary=:all: --implementation cp --python-version "$py" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 \
    Pillow importlib_metadata requests "httpx<1"
done
du -sh .whl
