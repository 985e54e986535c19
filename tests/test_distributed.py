"""Data parallelism through the real CLI: two CPU ranks (torchrun, gloo) that each take one
micro-batch per step end with the weights of one process that accumulates the same two
micro-batches per step (train.accum_steps=2), log the same losses, and leave a checkpoint that a
single process resumes.

Dropout is off (model.dropout=0): each rank draws its own dropout masks, so with dropout on the
two runs would differ by design, not by a bug.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from cometnmt.config import load_config
from cometnmt.training import run as run_module
from cometnmt.training.checkpoint import load_checkpoint

from conftest import REPO

STEPS, MORE_STEPS = 3, 5


def overrides(data_dir, save_dir, *extra: str) -> list[str]:
    return [
        f"data.multi30k_dir={data_dir}", "data.max_train_pairs=300", "data.max_valid_pairs=20",
        "train.batch_tokens=600", "model.dropout=0.0", "train.valid_bleu=false", "train.progress=false",
        "train.log_every=1", "train.num_threads=1", f"train.save_dir={save_dir}", *extra,
    ]


def train_in_process(data_dir, save_dir, *extra: str, resume: bool = False) -> dict:
    threads = torch.get_num_threads()
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)), resume=resume)
    finally:
        torch.set_num_threads(threads)  # the run sets train.num_threads for this whole process
    return load_checkpoint(save_dir / "last.pt")


def torchrun(data_dir, save_dir, *extra: str) -> subprocess.Popen:
    sets = [arg for o in overrides(data_dir, save_dir, *extra) for arg in ("--set", o)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "cometnmt", "train", "configs/tiny.yaml", *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def train_losses(save_dir) -> list[float]:
    lines = (save_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["event"] == "train"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


def test_two_ranks_equal_one_process_and_resume_in_one(tmp_path, data_dir):
    ddp_dir, one_dir = tmp_path / "ddp", tmp_path / "one"
    proc = torchrun(data_dir, ddp_dir, "train.accum_steps=1", f"train.max_steps={STEPS}")
    try:  # the single-process reference trains meanwhile
        one = train_in_process(data_dir, one_dir, "train.accum_steps=2", f"train.max_steps={STEPS}")
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    ddp = load_checkpoint(ddp_dir / "last.pt")

    assert ddp["step"] == one["step"] == STEPS
    assert ddp["trainer"]["consumed"] == one["trainer"]["consumed"] == 2 * STEPS  # micro-batches
    assert_same_weights(ddp["model"], one["model"])
    for a, b in zip(ddp["optimizer"]["state"].values(), one["optimizer"]["state"].values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-4, atol=1e-12)
    # the logged loss is the global one (summed over ranks), not rank 0's share
    assert train_losses(ddp_dir) == pytest.approx(train_losses(one_dir), rel=1e-5)
    assert len(train_losses(ddp_dir)) == STEPS

    # rank 0's checkpoint resumes in one process and goes on as the one-process run does
    resumed = train_in_process(data_dir, ddp_dir, "train.accum_steps=2", f"train.max_steps={MORE_STEPS}", resume=True)
    one = train_in_process(data_dir, one_dir, "train.accum_steps=2", f"train.max_steps={MORE_STEPS}", resume=True)
    assert resumed["step"] == one["step"] == MORE_STEPS
    assert_same_weights(resumed["model"], one["model"])
