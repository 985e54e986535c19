"""Shared fixtures: the Multi30k copy beside the repo (or $COMETNMT_MULTI30K_DIR) and a runner for
the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def state_buffers(module) -> list:
    """(name, buffer) of the buffers a checkpoint keeps (persistent ones): running statistics and
    counts, not scratch space such as MaskedBatchNorm's last batch's moments."""
    kept = module.state_dict(keep_vars=True)
    return [(k, b) for k, b in module.named_buffers() if k in kept]


def multi30k_dir() -> Path:
    env = os.environ.get("COMETNMT_MULTI30K_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data" / "multi30k"


def tiny_train_cfg(save_dir, data_dir, *overrides):
    """configs/tiny.yaml on 300 Multi30k pairs (from the folder ``data_dir``) in 600-token batches,
    two micro-batches a step, one epoch, no validation BLEU, checkpoints in ``save_dir``;
    ``overrides`` (dotted keys) come last. With data.corpus=files among them no folder is set, as
    that corpus reads none (train warns of a data.multi30k_dir beside it)."""
    from cometnmt.config import load_config

    folder = [] if "data.corpus=files" in overrides else [f"data.multi30k_dir={data_dir}"]
    return load_config(REPO / "configs" / "tiny.yaml", [
        *folder, "data.max_train_pairs=300", "data.max_valid_pairs=20",
        "train.batch_tokens=600", "train.max_epochs=1", "train.valid_bleu=false", "train.progress=false",
        "train.accum_steps=2", f"train.save_dir={save_dir}", *overrides,
    ])


DWCONV_PLUGIN = """\
import dataclasses
from dataclasses import dataclass
from typing import Literal

from cometnmt.models import register_architecture
from cometnmt.models.transformer import build_transformer


@dataclass
class DwConvConfig:
    kernel_size: int = 3  # FFN width = 16 * kernel_size: a checkpoint loads only with its own value
    padding: Literal["same", "causal"] = "same"


def build_dwconv(model_cfg, src_vocab_size, tgt_vocab_size, pad_id):
    section = model_cfg.dwconv
    model = build_transformer(dataclasses.replace(model_cfg, d_ff=16 * section.kernel_size), src_vocab_size,
                              tgt_vocab_size, pad_id)
    model.built_with = section
    return model


register_architecture("dwconv", build_dwconv, config=DwConvConfig)
"""


def load_plugins_as_cases() -> None:
    """cometnmt.models.load_plugins() for a test module whose cases include the architectures
    $COMETNMT_PLUGINS registers. A plugin that does not import fails the module's collection with
    the error's one line (the file, its failing line, the exception), not a traceback through
    importlib and the chained ConfigError."""
    from cometnmt.errors import ConfigError
    from cometnmt.models import load_plugins

    try:
        load_plugins()
    except ConfigError as exc:
        message = f"{exc} (its architectures are cases of this module: fix the module or unset $COMETNMT_PLUGINS)"
    else:
        return
    pytest.fail(message, pytrace=False)


def write_dwconv_plugin(folder: Path) -> Path:
    """A plugin file registering the architecture ``dwconv`` with its section ``model.dwconv``
    (kernel_size, padding): a Transformer whose FFN is 16 * kernel_size wide, the section it was
    built with kept as ``model.built_with``."""
    path = folder / "dwconv_plugin.py"
    path.write_text(DWCONV_PLUGIN, encoding="utf-8")
    return path


@pytest.fixture
def one_thread():
    """Timed training loops of tiny models: one intra-op thread (a second gains nothing, and on a
    busy 2-core machine oversubscribed threads slow them tenfold)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = multi30k_dir()
    if not (path / "train.de.gz").exists():
        pytest.fail(f"Multi30k not found at {path}; set COMETNMT_MULTI30K_DIR")
    return path


@pytest.fixture
def cli(data_dir, tmp_path):
    """Run `python -m cometnmt ARGS` in the repo root; returns CompletedProcess (text)."""

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
        stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}  # never the terminal
        proc = subprocess.run(
            [sys.executable, "-m", "cometnmt", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, **stdin
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"cometnmt {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc

    return run


@pytest.fixture(scope="session", autouse=True)
def sigint_handled():
    """Python's own SIGINT handler in this process and in the children it starts, whatever the
    launching shell did: a shell ignores SIGINT for a command it runs in the background (``cmd &``),
    and then interrupt_main() does nothing and children inherit the ignored signal. For the whole
    session: six tests of test_resume that send themselves SIGINT failed ("DID NOT RAISE
    KeyboardInterrupt") when the suite ran in the background, as they did not ask for it."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
