"""The numbers training reports: the metrics log's learning rate, loss and token counts mean what
the README says."""

from __future__ import annotations

import json

import pytest

from cometnmt.training import run as run_module
from cometnmt.training.optim import lr_factor

from conftest import tiny_train_cfg


def train_records(save_dir) -> list[dict]:
    lines = (save_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "train"]


def test_the_logged_learning_rate_is_the_one_its_step_took(tmp_path, data_dir):
    """A record of step s logs the rate step s trained at: lr * lr_factor(s - 1). Before, it logged
    ``scheduler.get_last_lr()`` read after the scheduler had moved on, the rate of step s + 1 (in
    warm-up: step 50 of 1,000 logged 51/1,000 of the peak)."""
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.schedule=inverse_sqrt", "train.warmup_steps=4", "train.lr=1e-3",
                         "train.log_every=1", "train.accum_steps=1", "train.max_steps=6")
    run_module.train(cfg)
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for r in records:
        assert r["lr"] == pytest.approx(1e-3 * lr_factor(r["step"] - 1, "inverse_sqrt", 4)), r
