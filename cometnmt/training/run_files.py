"""A run folder's file names, as the trainer writes them; every reader names them by these
constants (re-exported by :mod:`cometnmt.training.checkpoint`). No torch here, so the CLI's
``--help`` spells them without importing it."""

from __future__ import annotations

import re

LAST_CHECKPOINT = "last.pt"  # the run's latest state: each epoch's end, train.save_every, max_steps, an interrupt
BEST_CHECKPOINT = "best.pt"  # the best validation under the stopping rule's measure
EPOCH_CHECKPOINT = re.compile(r"epoch(\d+)\.pt")  # epoch_checkpoint_name's names (train.keep_checkpoints)
EPOCH_CHECKPOINT_GLOB = "epoch*.pt"  # a glob finding them (and names the trainer does not write: epoch_avg.pt)
METRICS_FILE = "metrics.jsonl"  # the run folder's log of train and valid records, one JSON object a line
CONFIG_FILE = "config.yaml"  # the run's config, written by train() as the run starts
