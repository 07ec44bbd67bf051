"""Test-wide settings: one thread (2 shared cores run 5-15x slower with two), offline hub; the
fixtures tests of several folders use."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Without this a hub look-up retries ~20 s per file; tests use tiny local models only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def no_model(monkeypatch):
    """Building a tiny model fails the test: the error must come before any weights load."""
    from lit_treegrpo.models import tiny

    def never(*args, **kwargs):
        raise AssertionError("a model was built before the configuration was checked")

    monkeypatch.setattr(tiny, "tiny_sd3_pipeline", never)
    monkeypatch.setattr(tiny, "tiny_sd15_pipeline", never)
