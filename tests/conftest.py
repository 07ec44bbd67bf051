"""Test-wide settings: one thread (2 shared cores run 5-15x slower with two), offline hub."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Without this a hub look-up retries ~20 s per file; tests use tiny local models only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
