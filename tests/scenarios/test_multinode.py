"""More than one machine: two "nodes" of one process each, started as a cluster starts them
(``torchrun --nnodes 2 --node_rank R`` per node), on this machine over 127.0.0.1 and gloo."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.cli.test_cli import QUIET, REPO, TINY, fit, trainable

# SGD, as tests/cli/test_cli.py's DDP test: Adam's first steps turn float noise into full updates
SGD = ("--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "10.0")
COMMON = ("--trainer.max_steps", "3", "--trainer.limit_val_batches", "0", *SGD)
PROBE = '{"class_path": "tests.probes.SaveRankParameters", "init_args": {"folder": "%s"}}'
TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(node_rank: int, port: int, root: Path, log: Path, *args: str) -> subprocess.Popen:
    """One node's launch, as on a cluster: torchrun with its node rank, one process on this node."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("LIT_TREEGRPO_DEBUG", None)
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's traffic on the loopback too, not the host's address
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--node_rank", str(node_rank), "--nproc_per_node", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(port),
        "-m", "lit_treegrpo", "fit", "--config", str(TINY), *QUIET, *args,
        "--trainer.default_root_dir", str(root),
    ]  # fmt: skip
    with open(log, "w") as out:  # a file, not a pipe: two live processes never block on a full pipe
        # its own process group, so that a timeout ends torchrun and the worker it started
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_all(nodes: list[subprocess.Popen], timeout_s: float) -> list[int | None]:
    """The nodes' exit codes, waiting until all ended, one failed (its peer would wait on it in a
    collective) or ``timeout_s`` passed; ``None`` for a node still running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [node.poll() for node in nodes]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            return codes
        time.sleep(0.5)
    return [node.poll() for node in nodes]


EVENTS = "tinysd3_tree-k2_mean_brightness/events.out.tfevents.*"


def files(root: Path) -> list[str]:
    """The run folder's files, a TensorBoard event file's host, time and pid left out of its name."""
    names = (str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return sorted(re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", n) for n in names)


@pytest.mark.slow  # three real multi-process runs: minutes on 2 cores
def test_two_nodes_through_torchrun_match_two_processes_on_one_node(tmp_path: Path) -> None:
    # the reference: 2 processes on one node (Lightning's own launcher), global batch 2
    fit(
        tmp_path / "one_node",
        *COMMON,
        "--data.batch_size", "1",
        "--trainer.strategy", "ddp",
        "--trainer.devices", "2",
    )  # fmt: skip
    # 2 nodes x 1 process, global batch 2; both nodes are given the same run folder, as on a
    # shared filesystem (one machine here). The global batch is given as such: each rank takes
    # 2 / (devices x num_nodes) = 1 prompt, as in the reference
    root, ranks = tmp_path / "two_nodes", tmp_path / "ranks"
    args = (
        *COMMON,
        "--data.batch_size", "null",
        "--data.global_batch_size", "2",
        "--trainer.accelerator", "cpu",
        "--trainer.strategy", "ddp",
        "--trainer.num_nodes", "2",
        "--trainer.devices", "1",
        "--trainer.callbacks+", PROBE % ranks,
    )  # fmt: skip
    port = free_port()
    logs = [tmp_path / f"node{r}.log" for r in (0, 1)]
    nodes = [start_node(r, port, root, logs[r], *args) for r in (0, 1)]
    try:
        codes = wait_all(nodes, TIMEOUT_S)
    finally:
        for node in nodes:  # a node still running: timed out, or its peer failed and it waits on it
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    for r in (0, 1):
        assert codes[r] == 0, f"node {r} exited with {codes[r]}:\n{logs[r].read_text()[-3000:]}"
        # node R's one process is global rank R of a world of 2 (Lightning's line, every rank)
        assert f"GLOBAL_RANK: {r}, MEMBER: {r + 1}/2" in logs[r].read_text()

    # global rank 0 (node 0) alone writes the run folder: the files of the one-node run, once
    # (checkpoints/last.ckpt, one TensorBoard event file, config.yaml, the sample grids); a second
    # writer would have left a second event file or a config-2.yaml
    written = files(root)
    assert written == files(tmp_path / "one_node"), written
    assert "checkpoints/last.ckpt" in written and written.count("tensorboard/" + EVENTS) == 1, written
    # the probe saved each global rank's trained weights, outside the run folder
    assert sorted(p.name for p in ranks.iterdir()) == ["rank0.pt", "rank1.pt"]

    one_node = trainable(tmp_path / "one_node" / "checkpoints" / "last.ckpt")
    two_nodes = trainable(root / "checkpoints" / "last.ckpt")
    assert two_nodes.keys() == one_node.keys()
    assert any(v.abs().max() > 1e-3 for k, v in one_node.items() if "lora_B" in k)  # it trained
    # bitwise: the same 2 ranks, data and gloo all-reduce, whichever launcher started them
    assert all(torch.equal(two_nodes[k], one_node[k]) for k in one_node)
    rank0, rank1 = torch.load(ranks / "rank0.pt"), torch.load(ranks / "rank1.pt")
    assert rank0.keys() == rank1.keys() == one_node.keys()
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # the nodes agree bitwise
    assert all(torch.equal(rank0[k], two_nodes[k]) for k in rank0)  # and the checkpoint holds them
