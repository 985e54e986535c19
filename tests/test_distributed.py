"""Data parallelism through the real CLI: two CPU ranks (torchrun, gloo) that each take one
micro-batch per step end with the weights of one process that accumulates the same two
micro-batches per step (train.accum_steps=2), log the same losses, and leave a checkpoint that a
single process resumes; every other architecture does too, its buffers (COMET's batch-norm running
statistics) and logged auxiliary losses included. Compiled ranks that accumulate (``no_sync``) end as one eager process does,
and accumulating ranks all-reduce once per step, not once per micro-batch.

The first two tests train with dropout: a micro-batch draws its masks from a seed of its own
(train.seed, epoch, index in the epoch), so they are the same whichever rank trains it. The
compiled test has dropout off, since a compiled model draws its random numbers its own way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed
import torch.multiprocessing

from cometnmt.config import load_config
from cometnmt.data.pipeline import Examples, read_split
from cometnmt.data.vocab import PAD
from cometnmt.models import build_model
from cometnmt.training import run as run_module
from cometnmt.training.checkpoint import load_checkpoint
from cometnmt.training.distributed import DistInfo, any_rank
from cometnmt.training.trainer import Trainer

from conftest import REPO

STEPS, MORE_STEPS = 3, 5
DROPOUT = "model.dropout=0.3"  # overrides the 0 of overrides(): masks must match across ranks


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a test's process group."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_until_all_stop(worker, args: tuple, seconds: float = 300) -> list[int]:
    """Two ranks of ``worker(rank, *args)``, each waited for on its own (torch's ``context.join()``
    kills the others when one fails), for at most ``seconds`` together: starting two interpreters
    with torch takes seconds (over a minute on a loaded 2-core machine: 120 s was once too few),
    while a rank waiting for a peer that left would wait for the process group's timeout
    (30 minutes), so one still running then fails the test. Their exit codes."""
    import time

    context = torch.multiprocessing.spawn(worker, nprocs=2, join=False, args=args)
    deadline = time.monotonic() + seconds
    try:
        for process in context.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            assert process.exitcode is not None, "a rank still waits"
    finally:
        for process in context.processes:
            process.kill()
    return [process.exitcode for process in context.processes]


def _train_and_record_the_error(rank: int, out: str, cfg, **kwargs) -> None:
    """A spawned rank's ``train(cfg, **kwargs)`` that must fail: the error it stopped with goes to
    ``out``.RANK as 'Class: message' and is raised again, so that the process exits non-zero."""
    try:
        run_module.train(cfg, **kwargs)
    except Exception as exc:
        with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        raise
    raise AssertionError(f"rank {rank} did not stop")


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


def torchrun(data_dir, save_dir, *extra: str, plugin=None) -> subprocess.Popen:
    """``cometnmt train`` on two ranks under torchrun; ``plugin``: a file each rank imports first
    ($COMETNMT_PLUGINS), to make one of them fail."""
    sets = [arg for o in overrides(data_dir, save_dir, *extra) for arg in ("--set", o)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "cometnmt", "train", "configs/tiny.yaml", *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if plugin is not None:
        env["COMETNMT_PLUGINS"] = str(plugin)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def train_losses(save_dir, key: str = "loss") -> list[float]:
    lines = (save_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r[key] for r in map(json.loads, lines) if r["event"] == "train"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


def test_two_ranks_equal_one_process_and_resume_in_one(tmp_path, data_dir):
    ddp_dir, one_dir = tmp_path / "ddp", tmp_path / "one"
    proc = torchrun(data_dir, ddp_dir, "train.accum_steps=1", f"train.max_steps={STEPS}", DROPOUT)
    try:  # the single-process reference trains meanwhile
        one = train_in_process(data_dir, one_dir, "train.accum_steps=2", f"train.max_steps={STEPS}", DROPOUT)
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
    resumed = train_in_process(data_dir, ddp_dir, "train.accum_steps=2", f"train.max_steps={MORE_STEPS}", DROPOUT, resume=True)
    one = train_in_process(data_dir, one_dir, "train.accum_steps=2", f"train.max_steps={MORE_STEPS}", DROPOUT, resume=True)
    assert resumed["step"] == one["step"] == MORE_STEPS
    assert_same_weights(resumed["model"], one["model"])
    # and as one process that was never stopped: 2 ranks -> 1 process -> on equals the uninterrupted run,
    # its losses step by step too (the run stopped at max_steps validated there: that changes nothing)
    straight = train_in_process(data_dir, tmp_path / "straight", "train.accum_steps=2", f"train.max_steps={MORE_STEPS}",
                                DROPOUT)
    assert_same_weights(resumed["model"], straight["model"])
    for a, b in zip(resumed["optimizer"]["state"].values(), straight["optimizer"]["state"].values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-4, atol=1e-12)
    assert train_losses(ddp_dir) == pytest.approx(train_losses(tmp_path / "straight"), rel=1e-5)
    assert len(train_losses(ddp_dir)) == MORE_STEPS


def test_a_short_last_step_and_a_resume_at_another_world_size(tmp_path, data_dir, monkeypatch):
    """An epoch of 7 micro-batches, started in one process (2 steps of 1) and resumed by two
    ranks: steps [2,3], [4,5] and a short last step [6], where rank 1 has no micro-batch and joins
    the all-reduce with a zero-weighted one. Before, DDP dropped the 7th micro-batch (the epoch was
    cut to a multiple of the ranks) and a resume at an odd position could hang."""
    import shutil

    common = ["train.batch_tokens=1000", "train.max_epochs=1", "train.log_every=10", DROPOUT]
    original, calls = Trainer.train_step, []

    def interrupt_third(self, group):  # Ctrl-C after 2 steps, inside a log window (max_steps would log it)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        train_in_process(data_dir, tmp_path / "one", "train.accum_steps=1", *common)
    monkeypatch.setattr(Trainer, "train_step", original)
    first = load_checkpoint(tmp_path / "one" / "last.pt")
    assert first["trainer"]["consumed"] == 2
    shutil.copytree(tmp_path / "one", tmp_path / "ddp")
    one = train_in_process(data_dir, tmp_path / "one", "train.accum_steps=2", *common, resume=True)
    sets = [arg for o in overrides(data_dir, tmp_path / "ddp", "train.accum_steps=1", *common) for arg in ("--set", o)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "cometnmt", "train", "configs/tiny.yaml", *sets, "--resume"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    ddp = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert ddp["epoch"] == one["epoch"] == 1 and ddp["step"] == one["step"] == 5  # 2 + 3 steps, the last short
    assert ddp["trainer"]["history"][0]["val_loss"] == pytest.approx(one["trainer"]["history"][0]["val_loss"], rel=1e-5)
    assert_same_weights(ddp["model"], one["model"])
    # the log window open at the interrupt's checkpoint (steps 1-2, train.log_every=10) is carried into
    # both resumes: the epoch's one record covers steps 1-5, its saved loss counted once over the ranks
    assert train_losses(tmp_path / "ddp", "step") == train_losses(tmp_path / "one", "step") == [5]
    assert train_losses(tmp_path / "ddp") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)


def _interrupted_rank(rank: int, world: int, port: int, data_dir: str, save_dir: str, *extra: str) -> None:
    """One rank of ``test_an_interrupted_ddp_run_saves_the_log_window_of_every_rank``: the CLI's
    training under torchrun's environment, Ctrl-C (a KeyboardInterrupt) at its third step."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    original, calls = Trainer.train_step, []

    def interrupt_third(self, group):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, group)

    Trainer.train_step = interrupt_third
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)))
    except KeyboardInterrupt:
        return
    raise AssertionError(f"rank {rank} was not interrupted")


def test_an_interrupted_ddp_run_saves_the_log_window_of_every_rank(tmp_path, data_dir):
    """Two ranks stopped by Ctrl-C after 2 steps inside a log window (train.log_every=10): last.pt
    holds the window of both ranks' micro-batches, and the resumed epoch's one record (step 5)
    covers steps 1-5 as one uninterrupted process's does. Before, a DDP checkpoint kept no window
    (each rank held its own losses only), and the record covered steps 3-5 alone."""

    common = ["train.max_epochs=1", "train.log_every=10", DROPOUT]
    port = _free_port()
    torch.multiprocessing.spawn(_interrupted_rank, nprocs=2, join=True,
                                args=(2, port, str(data_dir), str(tmp_path / "ddp"), "train.accum_steps=1", *common))
    saved = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert saved["step"] == 2 and saved["trainer"]["window"] is not None
    one = train_in_process(data_dir, tmp_path / "one", "train.accum_steps=2", *common)
    resumed = train_in_process(data_dir, tmp_path / "ddp", "train.accum_steps=2", *common, resume=True)
    assert resumed["step"] == one["step"] == 5
    assert train_losses(tmp_path / "ddp", "step") == train_losses(tmp_path / "one", "step") == [5]
    assert train_losses(tmp_path / "ddp") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)


class _Term(KeyboardInterrupt):
    """What the CLI's SIGTERM handler raises (cli._Terminated), without importing the CLI."""


def _rank_one_terminated(rank: int, world: int, port: int, where: str, data_dir: str, save_dir: str, *extra: str) -> None:
    """One rank of ``test_a_signal_to_one_rank_stops_every_rank_at_one_step``: rank 1 alone gets a
    real SIGTERM (raising as under the CLI) inside its second step (``where`` "step") or among the
    last epoch's checkpoints ("last_epoch_end"); rank 0 only a SIGINT it ignores (as a run a script
    started in the background does), in its first step."""
    import signal

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def raise_term(signum, frame):
        raise _Term

    signal.signal(signal.SIGTERM, raise_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    original, original_stopping, calls = Trainer.train_step, Trainer.update_stopping, []

    def signalled_second(self, group):
        out = original(self, group)
        calls.append(1)
        if rank == 1 and len(calls) == 2 and where == "step":
            os.kill(os.getpid(), signal.SIGTERM)
        if rank == 0 and len(calls) == 1:  # ignored: no interrupt, the ranks go on
            os.kill(os.getpid(), signal.SIGINT)
        return out

    def signalled_last(self, m):  # inside the epoch's checkpoints block, on every rank
        if rank == 1 and where == "last_epoch_end" and self.epoch == self.tc.max_epochs:
            os.kill(os.getpid(), signal.SIGTERM)
        return original_stopping(self, m)

    Trainer.train_step, Trainer.update_stopping = signalled_second, signalled_last
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)))
    except KeyboardInterrupt as exc:
        # rank 1 stops for its own SIGTERM (raised as its handler raises it), rank 0 for rank 1's
        assert isinstance(exc, _Term) == (rank == 1), (rank, type(exc))
        assert len(calls) == (2 if where == "step" else 5), (rank, len(calls))
        return
    raise AssertionError(f"rank {rank} was not interrupted")


@pytest.mark.parametrize("where", ["step", "last_epoch_end"])
def test_a_signal_to_one_rank_stops_every_rank_at_one_step(tmp_path, data_dir, where):
    """A SIGTERM that reaches one rank (torchrun passes its own on to the ranks one after another,
    and the terminal's Ctrl-C reaches them in any order): every rank stops after the same step and
    rank 0 saves it. Before, the signalled rank stopped alone; the other went on into the next
    step's all-reduce (or, at the run's end, shutdown's barrier), which failed with gloo's
    "Connection closed by peer" traceback once the first had exited, and where that rank was rank
    0, last.pt was never saved."""

    common = ["train.accum_steps=1", "train.max_epochs=1", "train.log_every=10", DROPOUT]
    port = _free_port()
    torch.multiprocessing.spawn(_rank_one_terminated, nprocs=2, join=True,
                                args=(2, port, where, str(data_dir), str(tmp_path / "ddp"), *common))
    saved = load_checkpoint(tmp_path / "ddp" / "last.pt")
    if where == "step":
        assert saved["step"] == 2 and saved["trainer"]["consumed"] == 4 and saved["trainer"]["window"] is not None
    else:  # the epoch (its 5 steps) done, with its validation
        assert saved["step"] == 5 and saved["epoch"] == 1 and len(saved["trainer"]["history"]) == 1


def _any_rank_answers(rank: int, world: int, port: int, flags: list[list[bool]], answers) -> None:
    """One rank of ``test_any_rank_is_true_where_one_rank_is``: asks :func:`any_rank` once per row
    of ``flags`` (its own column) and puts its answers in the queue."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        answers.put((rank, [any_rank(row[rank], DistInfo(rank, world, rank)) for row in flags]))
    finally:
        torch.distributed.destroy_process_group()


def test_any_rank_is_true_where_one_rank_is():
    """The one "has any rank been interrupted?" all-reduce (the trainer's and the set-up's): every
    rank gets the same answer, true where at least one rank's flag is; in a single process (one
    rank, or no process group) the answer is the flag itself."""

    assert any_rank(True, None) and not any_rank(False, None)
    assert any_rank(True, DistInfo()) and not any_rank(False, DistInfo())
    flags = [[False, False], [True, False], [False, True], [True, True]]
    port = _free_port()
    answers = torch.multiprocessing.get_context("spawn").SimpleQueue()
    torch.multiprocessing.spawn(_any_rank_answers, nprocs=2, join=True, args=(2, port, flags, answers))
    got = dict(answers.get() for _ in range(2))
    assert got == {0: [False, True, True, True], 1: [False, True, True, True]}


def _terminated_while_setting_up(rank: int, world: int, port: int, where: str, data_dir: str, save_dir: str) -> None:
    """One rank of ``test_a_signal_to_one_rank_while_setting_up_stops_every_rank``: one rank alone
    gets a real SIGTERM (raising as under the CLI): rank 1 as it comes to the data (``where``
    "data"), while it waits for rank 0 to prepare them ("waiting"), or while it builds the trainer,
    DDP's wrapper included ("trainer"); rank 0 while it reads the data, before it makes the run
    folder ("rank0_reading"), or while it encodes them ("rank0_data")."""
    import signal

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def raise_term(signum, frame):
        raise _Term

    signal.signal(signal.SIGTERM, raise_term)
    original_prepare, original_reduce = run_module._prepare_once, run_module.all_reduce_sum
    original_examples, original_init = run_module.training_examples, Trainer.__init__
    original_read = run_module.read_splits
    signalled = 0 if where.startswith("rank0_") else 1

    def read_splits(*args):
        if rank == 0 and where == "rank0_reading":
            os.kill(os.getpid(), signal.SIGTERM)
        return original_read(*args)

    def prepare_once(*args):
        if rank == 1 and where == "data":
            os.kill(os.getpid(), signal.SIGTERM)
        return original_prepare(*args)

    def all_reduce_sum(*args):  # rank 1's first is where it waits for rank 0's data
        if rank == 1 and where == "waiting" and not getattr(all_reduce_sum, "done", False):
            all_reduce_sum.done = True
            os.kill(os.getpid(), signal.SIGTERM)
        return original_reduce(*args)

    def examples(*args):
        if rank == 0 and where == "rank0_data":
            os.kill(os.getpid(), signal.SIGTERM)
        return original_examples(*args)

    def trainer_init(self, *args):
        if rank == 1 and where == "trainer":
            os.kill(os.getpid(), signal.SIGTERM)
        original_init(self, *args)

    run_module._prepare_once, run_module.all_reduce_sum = prepare_once, all_reduce_sum
    run_module.training_examples, Trainer.__init__ = examples, trainer_init
    run_module.read_splits = read_splits
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, "train.max_epochs=1")))
    except KeyboardInterrupt as exc:  # the signalled rank for its own SIGTERM, the other for its peer's
        assert isinstance(exc, _Term) == (rank == signalled), (rank, type(exc))
        return
    raise AssertionError(f"rank {rank} was not interrupted")


@pytest.mark.parametrize("where", ["data", "waiting", "rank0_reading", "rank0_data", "trainer"])
def test_a_signal_to_one_rank_while_setting_up_stops_every_rank(tmp_path, data_dir, where):
    """A SIGTERM that reaches one rank before training (reading, encoding or tagging the data on
    rank 0, waiting for them on rank 1, building the model, wrapping it in DDP): every rank stops
    before training, with a
    KeyboardInterrupt, and nothing is trained or saved. Before, the signalled rank stopped alone and
    the other failed in its next collective (DDP's first broadcast, or the first step's all-reduce)
    with gloo's "Connection closed by peer" RuntimeError (under torchrun, still joining the process
    group, it waited there until torchrun killed it 30 seconds later)."""
    port = _free_port()
    torch.multiprocessing.spawn(_terminated_while_setting_up, nprocs=2, join=True,
                                args=(2, port, where, str(data_dir), str(tmp_path / "ddp")))
    assert not (tmp_path / "ddp" / "last.pt").exists() and not (tmp_path / "ddp" / "metrics.jsonl").exists()
    assert where != "rank0_reading" or not (tmp_path / "ddp").exists()


def _terminated_as_training_begins(rank: int, world: int, port: int, where: str, data_dir: str, save_dir: str) -> None:
    """One rank of ``test_a_signal_to_one_rank_as_training_begins_stops_every_rank``: rank 1 alone
    gets a real SIGTERM (raising as under the CLI) after the ranks' last agreement of the set-up,
    before ``Trainer.fit`` notes signals itself: as ``train`` calls fit (``where`` "call"), or in
    fit's first line ("entry")."""
    import signal

    from cometnmt.training import trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def raise_term(signum, frame):
        raise _Term

    signal.signal(signal.SIGTERM, raise_term)
    original_fit, original_folder = Trainer.fit, trainer_module.make_folder

    def fit(self, *args, **kwargs):
        if rank == 1 and where == "call":
            os.kill(os.getpid(), signal.SIGTERM)
        return original_fit(self, *args, **kwargs)

    def make_folder(*args):  # fit's first line
        if rank == 1 and where == "entry":
            os.kill(os.getpid(), signal.SIGTERM)
        return original_folder(*args)

    Trainer.fit, trainer_module.make_folder = fit, make_folder
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, "train.max_epochs=1",
                                                                               "train.accum_steps=1")))
    except KeyboardInterrupt as exc:  # rank 1 for its own SIGTERM, rank 0 for its peer's
        assert isinstance(exc, _Term) == (rank == 1), (rank, type(exc))
        return
    raise AssertionError(f"rank {rank} was not interrupted")


@pytest.mark.parametrize("where", ["call", "entry"])
def test_a_signal_to_one_rank_as_training_begins_stops_every_rank(tmp_path, data_dir, where):
    """A SIGTERM that reaches one rank after the set-up's last agreement (``_SetUp.done``) and
    before ``Trainer.fit`` notes signals itself is carried into fit: the first step's all-reduce
    carries it, every rank stops after that step and rank 0 saves it. Before, the signal stopped
    its rank alone there, and the other failed in the first step's all-reduce with gloo's
    "Connection closed by peer" RuntimeError."""
    port = _free_port()
    torch.multiprocessing.spawn(_terminated_as_training_begins, nprocs=2, join=True,
                                args=(2, port, where, str(data_dir), str(tmp_path / "ddp")))
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["step"] == 1


def _counting_rank(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str, *extra: str) -> None:
    """One rank of ``test_rank_zero_alone_prepares_the_data_and_the_ranks_share_validation``: the
    CLI's training under torchrun's environment; every codec build, tagging pass and validation
    decoding is appended to ``out`` as a JSON line, and rank 0's scored hypotheses too."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from cometnmt.training import trainer as trainer_module

    def note(**record) -> None:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"rank": rank, **record}) + "\n")

    original_codec, original_tags = run_module.build_codec, run_module.attach_training_tags
    original_scores, original_translate = trainer_module.corpus_scores, trainer_module.Translator.translate_ids

    def build_codec(*args):
        note(event="codec")
        return original_codec(*args)

    def attach_training_tags(*args):
        note(event="tags")
        return original_tags(*args)

    def corpus_scores(hyps, refs, **kwargs):
        note(event="scored", hyps=hyps)
        return original_scores(hyps, refs, **kwargs)

    def translate_ids(self, src_ids, *args, **kwargs):
        found = original_translate(self, src_ids, *args, **kwargs)
        note(event="decoded", sentences=sum(1 for h in found if h), of=len(src_ids))
        return found

    run_module.build_codec, run_module.attach_training_tags = build_codec, attach_training_tags
    trainer_module.corpus_scores, trainer_module.Translator.translate_ids = corpus_scores, translate_ids
    run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)))


def test_rank_zero_alone_prepares_the_data_and_the_ranks_share_validation(tmp_path, data_dir, monkeypatch):
    """Two ranks: rank 0 alone builds the codec and tags the training data (the other receives
    them), each rank decodes its share of the validation batches, and rank 0 scores the gathered
    translations: the same hypotheses, in the same order, and the same BLEU as one process's, and
    the same weights. Before, each rank built the codec, tagged and decoded the whole validation
    set itself (two codec builds, two tagging passes, two full decodings)."""

    common = ["train.max_epochs=1", "train.valid_bleu=true", "decode.batch_sentences=4", DROPOUT]  # 20 sentences, 5 batches
    port = _free_port()
    out = tmp_path / "calls.jsonl"
    torch.multiprocessing.spawn(_counting_rank, nprocs=2, join=True,
                                args=(2, port, str(data_dir), str(tmp_path / "ddp"), str(out), "train.accum_steps=1", *common))
    calls = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(c["rank"], c["event"]) for c in calls if c["event"] in ("codec", "tags")] == [(0, "codec"), (0, "tags")]
    decoded = {c["rank"]: c for c in calls if c["event"] == "decoded"}
    assert decoded.keys() == {0, 1} and decoded[0]["of"] == decoded[1]["of"] == 20
    assert decoded[0]["sentences"] + decoded[1]["sentences"] == 20 and 0 < decoded[1]["sentences"] < 20
    scored = [c for c in calls if c["event"] == "scored"]
    assert [c["rank"] for c in scored] == [0]  # rank 0 scores, once

    from cometnmt.training import trainer as trainer_module

    one_hyps = []
    original_scores = trainer_module.corpus_scores
    monkeypatch.setattr(trainer_module, "corpus_scores", lambda hyps, refs, **kw: one_hyps.append(hyps) or original_scores(hyps, refs, **kw))
    one = train_in_process(data_dir, tmp_path / "one", "train.accum_steps=2", *common)
    assert scored[0]["hyps"] == one_hyps[0]
    ddp = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert_same_weights(ddp["model"], one["model"])
    for key in ("val_bleu", "val_chrf", "val_paper_bleu"):
        assert ddp["trainer"]["history"][0].get(key) == one["trainer"]["history"][0].get(key), key
    assert "val_bleu" in ddp["trainer"]["history"][0]


def _counting_validation_batches(note) -> None:
    """Make trainer.token_loss ``note(tokens=...)`` each validation batch's target tokens (a loss
    computed without gradients is validation's; training's takes them), and Trainer.improves, where
    the stopping rule and best.pt read a validation, ``note(val_loss=...)`` the loss it reads."""
    from cometnmt.training import trainer as trainer_module

    original_loss, original_improves = trainer_module.token_loss, Trainer.improves

    def token_loss(logits, gold, label_smoothing):
        if not torch.is_grad_enabled():
            note(tokens=int((gold != PAD).sum()))
        return original_loss(logits, gold, label_smoothing)

    def improves(self, m):
        note(val_loss=m["val_loss"])
        return original_improves(self, m)

    trainer_module.token_loss, Trainer.improves = token_loss, improves


def _validating_rank(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str, *extra: str) -> None:
    """One rank of ``test_the_ranks_share_the_validation_loss``: the CLI's training under torchrun's
    environment; each validation batch's loss and each validation the stopping rule reads are
    appended to ``out`` as JSON lines (:func:`_counting_validation_batches`)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def note(**record) -> None:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"rank": rank, **record}) + "\n")

    _counting_validation_batches(note)
    run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)))


# the 20 validation pairs in several batches (100), in one (600); every other architecture in several
@pytest.mark.parametrize("arch, batch_tokens", [("transformer", 100), ("transformer", 600),
                                                ("comet_temporal_conv_bn_length_tied", 100),
                                                ("transformer_pp", 100), ("convs2s", 100)])
def test_the_ranks_share_the_validation_loss(tmp_path, data_dir, monkeypatch, arch, batch_tokens):
    """Two ranks: each computes the validation loss of every other batch one process computes
    (rank 0 the 1st, 3rd, ...; rank 1 the 2nd, 4th, ...; none where there is one batch), and the
    loss metrics.jsonl records and every rank's stopping rule reads is one process's. Before, each
    rank computed the loss of every batch itself. Every kind of model: COMET's batch norms validate
    in eval mode on their running statistics (per source length here), which after the step are the
    same on both ranks as in one process (distributed.SyncedRunningStatistics); Transformer++'s
    validation loss is the translation's alone (its tag losses are training's); ConvS2S."""
    common = [f"train.batch_tokens={batch_tokens}", "train.max_steps=1"]  # validated at step 1 (valid_mid_epoch)
    if arch != "transformer":
        common += ARCHITECTURES[arch]
    if arch == "transformer_pp":
        from test_transformer_pp import english_pipeline_or_skip

        english_pipeline_or_skip()
        common.append(f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}")  # atomic writes: shared safely
    out = tmp_path / "calls.jsonl"
    torch.multiprocessing.spawn(_validating_rank, nprocs=2, join=True,
                                args=(2, _free_port(), str(data_dir), str(tmp_path / "ddp"), str(out),
                                      "train.accum_steps=1", *common))
    from cometnmt.training import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "token_loss", trainer_module.token_loss)  # restored after the test
    monkeypatch.setattr(Trainer, "improves", Trainer.improves)
    one_calls: list[dict] = []
    _counting_validation_batches(lambda **record: one_calls.append(record))
    train_in_process(data_dir, tmp_path / "one", "train.accum_steps=2", *common)

    calls = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    one_batches = [c["tokens"] for c in one_calls if "tokens" in c]
    assert len(one_batches) == 1 if batch_tokens == 600 else len(one_batches) >= 3  # 600: rank 1 has none
    for rank in (0, 1):
        assert [c["tokens"] for c in calls if c["rank"] == rank and "tokens" in c] == one_batches[rank::2], rank
    one_loss = [c["val_loss"] for c in one_calls if "val_loss" in c]
    assert len(one_loss) == 1
    for rank in (0, 1):
        assert [c["val_loss"] for c in calls if c["rank"] == rank and "val_loss" in c] == pytest.approx(one_loss, rel=1e-6)
    records = [[r for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text(encoding="utf-8").splitlines())
                if r["event"] == "valid_mid_epoch"] for run in ("ddp", "one")]
    assert len(records[0]) == len(records[1]) == 1
    for key in ("val_loss", "val_loss_per_100_tokens"):
        assert records[0][0][key] == pytest.approx(records[1][0][key], rel=1e-6), key


def _rank_one_fails_validating(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_failure_of_rank_one_while_computing_the_validation_loss_stops_every_rank``:
    rank 1's loss of a validation batch fails (out of memory, say); each rank writes the error it
    stopped with to ``out``.RANK, then exits with it (non-zero)."""
    from cometnmt.training import trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    original = trainer_module.token_loss

    def failing(logits, gold, label_smoothing):
        if not torch.is_grad_enabled():  # validation's, not training's
            raise RuntimeError("out of memory on rank 1")
        return original(logits, gold, label_smoothing)

    if rank == 1:
        trainer_module.token_loss = failing
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(
        data_dir, save_dir, "train.max_steps=1", "train.batch_tokens=100")))  # 4 validation batches: 2 a rank


def test_a_failure_of_rank_one_while_computing_the_validation_loss_stops_every_rank(tmp_path, data_dir):
    """Rank 1 fails while it computes its share of the validation loss: it stops with its error, and
    rank 0, which waits for the ranks' sums, stops at once with rank 1's error, both exiting non-zero
    (before the ranks shared the loss, a rank that failed there failed alike on every rank)."""
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_one_fails_validating,
                                 (2, _free_port(), str(data_dir), str(tmp_path / "ddp"), str(out))) == [1, 1]
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == "RuntimeError: out of memory on rank 1"
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == (
        "RankFailed: rank 1 failed computing its share of the validation loss: RuntimeError: out of memory on rank 1")
    assert not (tmp_path / "ddp" / "last.pt").exists()


def _failing_rank_zero(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_failure_of_rank_zero_while_preparing_the_data_stops_every_rank``: rank 0's
    preparation fails; each rank writes the error it stopped with to ``out``.RANK."""
    from cometnmt.errors import DataError

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def failing(*args):
        raise DataError("data/train.de:7: something rank 0 alone found")

    run_module.training_examples = failing if rank == 0 else None  # rank 1 never prepares
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir)))
    except DataError as exc:
        with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
            f.write(str(exc))
        return
    raise AssertionError(f"rank {rank} did not stop")


def test_a_failure_of_rank_zero_while_preparing_the_data_stops_every_rank(tmp_path, data_dir):
    """Rank 0 fails while it alone prepares the data: it stops with its error, and rank 1, which
    waits for the data, stops at once with rank 0's error (not waiting for data that never comes,
    which gloo would give up on only after 30 minutes)."""
    port = _free_port()
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_failing_rank_zero, (2, port, str(data_dir), str(tmp_path / "ddp"), str(out)),
                                 seconds=180) == [0, 0]  # each rank catches its error and writes it
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == "data/train.de:7: something rank 0 alone found"
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == (
        "rank 0 failed preparing the data: data/train.de:7: something rank 0 alone found")


def _rank_zero_fails_scoring(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_failure_of_rank_zero_while_scoring_validation_stops_every_rank``: rank 0's
    scorer of the validation translations fails; each rank writes the error it stopped with to
    ``out``.RANK, then exits with it (non-zero)."""
    from cometnmt.training import trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def failing(*args, **kwargs):
        raise ValueError("the scorer broke on rank 0")

    trainer_module.corpus_scores = failing if rank == 0 else None  # rank 1 never scores
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(
        data_dir, save_dir, "train.max_steps=1", "train.valid_bleu=true", "train.valid_bleu_max_sentences=4")))


def test_a_failure_of_rank_zero_while_scoring_validation_stops_every_rank(tmp_path, data_dir):
    """Rank 0 fails while it scores the translations the ranks gathered: it stops with its error,
    and rank 1, which waits for the scores, stops at once with rank 0's error, both exiting
    non-zero. Before, rank 1 waited in the broadcast of scores that never came (gloo gives up only
    after its timeout, 30 minutes by default) or failed there with gloo's own error, which does
    not say what happened."""
    port = _free_port()
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_zero_fails_scoring,
                                 (2, port, str(data_dir), str(tmp_path / "ddp"), str(out))) == [1, 1]
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == "ValueError: the scorer broke on rank 0"
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == (
        "RankFailed: rank 0 failed scoring the validation translations: ValueError: the scorer broke on rank 0")


def _rank_one_fails_decoding(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_failure_of_rank_one_while_decoding_validation_stops_every_rank``: rank
    1's decoding of its share of the validation set fails; each rank writes the error it stopped
    with to ``out``.RANK, then exits with it (non-zero)."""
    from cometnmt.training import trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def failing(self, *args, **kwargs):
        raise ValueError("the decoder broke on rank 1")

    if rank == 1:
        trainer_module.Translator.translate_ids = failing
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(
        data_dir, save_dir, "train.max_steps=1", "train.valid_bleu=true", "train.valid_bleu_max_sentences=4")))


def test_a_failure_of_rank_one_while_decoding_validation_stops_every_rank(tmp_path, data_dir):
    """Rank 1 fails while it decodes its share of the validation set: it stops with its error, and
    rank 0, which waits for the ranks' translations, stops at once with rank 1's error, both
    exiting non-zero. Before, rank 0 waited in the gather of the translations and failed there with
    gloo's "Connection closed by peer" once rank 1 had left (or at the timeout), which does not say
    what happened."""
    port = _free_port()
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_one_fails_decoding,
                                 (2, port, str(data_dir), str(tmp_path / "ddp"), str(out))) == [1, 1]
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == "ValueError: the decoder broke on rank 1"
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == (
        "RankFailed: rank 1 failed decoding its share of the validation set: ValueError: the decoder broke on rank 1")


RANK_ONE_DECODER_BREAKS = """\\
import os

from cometnmt import errors
from cometnmt.training import trainer

if os.environ["RANK"] == "1":
    def failing(self, *args, **kwargs):
        raise {kind}("{where}the decoder " + "broke on rank 1")  # the message is not this line's text

    trainer.Translator.translate_ids = failing
"""


@pytest.mark.parametrize("kind, where, status", [("ValueError", "", 1), ("errors.DataError", "data/valid.de:3: ", 2)])
def test_a_ranks_error_is_shown_once_under_torchrun(tmp_path, data_dir, kind, where, status):
    """Rank 1's decoding of its share of the validation set fails under torchrun, with a bug (a
    ValueError) or a usage error (the toolkit's DataError): rank 1 shows it (a bug with its
    traceback, a usage error as its one line), and rank 0, which learns of it in the gather, says
    in one line which rank failed doing what, not the error again. Before, rank 0 showed it a
    second time: a bug with the traceback of the gather, which says nothing, a usage error as a
    second line ("rank 1 failed decoding ...: data/valid.de:3: ..."). Both exit as rank 1 does
    (1, 2); torchrun itself exits 1 (its ChildFailedError, listing each rank's own exit status),
    as docs/training.md says. Rank 0's train.log (rank 1 writes none) keeps the whole message, and for a
    bug rank 1's traceback, which rank 1 sent with the error (before, the message alone), not the
    gather's."""
    plugin = tmp_path / "breaks.py"
    plugin.write_text(RANK_ONE_DECODER_BREAKS.format(kind=kind, where=where), encoding="utf-8")
    proc = torchrun(data_dir, tmp_path / "ddp", "train.max_steps=1", "train.valid_bleu=true",
                    "train.valid_bleu_max_sentences=4", plugin=plugin)
    out, _ = proc.communicate(timeout=300)
    name = kind.split(".")[-1]
    message = f"{where}the decoder broke on rank 1"
    assert out.count(message) == 1, out
    bug = status == 1
    assert out.count("Traceback (most recent call last)") == 1 + bug, out  # torchrun's own, and a bug's on rank 1
    assert (f"cometnmt: error: rank 0 of 2 stopped training: rank 1 failed decoding its share of the validation set "
            f"({name}); that rank's own output shows the error") in out, out
    assert out.count("that rank's own output shows the error with its traceback") == bug, out
    assert proc.returncode == 1, out
    assert "ChildFailedError" in out and f"exitcode  : {status} " in out, out
    log = (tmp_path / "ddp" / "train.log").read_text(encoding="utf-8")
    said = f"the run stopped: rank 1 failed decoding its share of the validation set: {name + ': ' if bug else ''}{message}"
    assert said in log and "all_gather" not in log, log
    if bug:  # rank 1's traceback, its source line and all
        assert f"{said}\nTraceback (most recent call last)" in log and '"the decoder " + "broke on rank 1"' in log, log
    else:
        assert "Traceback" not in log, log


def _rank_zero_fails_plotting(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_failure_of_rank_zeros_attention_plots_is_a_warning``: rank 0's attention
    plot fails; each rank writes the error it stopped with, or 'trained', to ``out``.RANK."""
    import cometnmt.plots

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def failing(*args, **kwargs):
        raise OSError("no space left for the plot on rank 0")

    cometnmt.plots.plot_attention = failing if rank == 0 else None  # rank 1 never plots
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(
            data_dir, save_dir, "train.max_steps=1", "train.attention_plots=2")))
        said = "trained"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
        f.write(said)


def test_a_failure_of_rank_zeros_attention_plots_is_a_warning(tmp_path, data_dir):
    """Rank 0 alone draws train.attention_plots' heatmaps; where that fails, it warns in train.log and
    every rank trains on (the plots are for watching). Before, the error stopped rank 0 alone, and
    rank 1 failed in its next collective with gloo's "Connection closed by peer"."""
    port = _free_port()
    out = tmp_path / "said"
    torch.multiprocessing.spawn(_rank_zero_fails_plotting, nprocs=2, join=True,
                                args=(2, port, str(data_dir), str(tmp_path / "ddp"), str(out)))
    said = [(tmp_path / f"said.{rank}").read_text(encoding="utf-8") for rank in range(2)]
    assert said == ["trained", "trained"]
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["step"] == 1
    log_text = (tmp_path / "ddp" / "train.log").read_text(encoding="utf-8")
    assert ("train.attention_plots: the attention plots of step 1 failed (OSError: no space left for the plot on "
            "rank 0); training goes on without them") in log_text


def _rank_zero_fails_saving(rank: int, world: int, port: int, resume: bool, data_dir: str, save_dir: str, out: str,
                            *extra: str) -> None:
    """One rank of ``test_a_failure_of_rank_zero_while_writing_checkpoints_stops_every_rank``: rank 0's
    checkpoint writes fail (a full disk), in a new run or a ``resume``; each rank writes the error it
    stopped with to ``out``.RANK, then exits with it (non-zero)."""
    from cometnmt.training import trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")

    trainer_module.save_checkpoint = failing if rank == 0 else None  # rank 1 never writes
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)),
                                resume=resume)


@pytest.mark.parametrize("where, extra, doing", [
    ("save_every", ["train.save_every=1", "train.max_steps=2"], "writing last.pt at step 1"),
    ("max_steps", ["train.max_steps=1"], "writing the record and checkpoints of step 1"),
    ("epoch_end", ["train.max_epochs=1"], "writing the record and checkpoints of epoch 1"),
    ("align", ["train.stopping=none", "train.valid_bleu=true", "train.max_epochs=3", "train.keep_checkpoints=2"],
     "making {}/best.pt the model of the best validation"),
])
def test_a_failure_of_rank_zero_while_writing_checkpoints_stops_every_rank(tmp_path, data_dir, monkeypatch, where,
                                                                           extra, doing):
    """Rank 0 alone writes the checkpoints (and metrics.jsonl); where that fails (a full disk) at
    save_every, at max_steps inside an epoch, at an epoch's end, or on a resume under a stopping
    rule of another measure, where best.pt is made the replayed best's kept epoch checkpoint
    (``Trainer._align_best_checkpoint``), it stops with its error and the other rank at once with a
    copy naming it, both exiting non-zero. Before, rank 0 stopped alone and rank 1 failed in its
    next collective with gloo's "Connection closed by peer"."""
    port = _free_port()
    if where == "align":  # 2 epochs under bleu_patience: best.pt is epoch 2 (BLEU 30), the lowest loss epoch 1's
        scores = iter([{"val_loss": loss, "val_loss_per_100_tokens": 100 * loss, "val_bleu": bleu}
                       for loss, bleu in ((2.0, 20.0), (3.0, 30.0))])
        monkeypatch.setattr(Trainer, "validate", lambda self: next(scores))
        train_in_process(data_dir, tmp_path / "ddp", "train.stopping=bleu_patience", "train.valid_bleu=true",
                         "train.max_epochs=2", "train.keep_checkpoints=2")
        assert load_checkpoint(tmp_path / "ddp" / "best.pt")["epoch"] == 2
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_zero_fails_saving, (2, port, where == "align", str(data_dir),
                                                           str(tmp_path / "ddp"), str(out), *extra)) == [1, 1]
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == "OSError: [Errno 28] No space left on device"
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == (
        f"RankFailed: rank 0 failed {doing.format(tmp_path / 'ddp')}: OSError: [Errno 28] No space left on device")
    if where == "align":  # the resume stopped before training: best.pt is as it was
        assert load_checkpoint(tmp_path / "ddp" / "best.pt")["epoch"] == 2


def _rank_zero_fails_logging(rank: int, world: int, port: int, fail_at: str, data_dir: str, save_dir: str, out: str,
                             *extra: str) -> None:
    """One rank of ``test_a_failure_of_rank_zero_while_writing_metrics_stops_every_rank``: rank 0's
    write of the metrics.jsonl record ``fail_at`` ("EVENT" or "EVENT STEP") fails as on a full disk
    (in the write, an OSError naming no file); each rank writes the error it stopped with to
    ``out``.RANK, then exits with it (non-zero)."""
    from cometnmt.training import trainer as trainer_module

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def on_a_full_disk(path, *args, **kwargs):
        f = open(path, *args, **kwargs)
        write = f.write

        def failing(text: str) -> int:
            record = json.loads(text)
            if fail_at in (record["event"], f"{record['event']} {record['step']}"):
                raise OSError(28, "No space left on device")
            return write(text)

        f.write = failing
        return f

    trainer_module.open = on_a_full_disk if rank == 0 else None  # rank 1 never writes metrics.jsonl
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, *extra)))


@pytest.mark.parametrize("fail_at, extra, doing", [
    ("train 1", ["train.max_steps=3"], "writing the record of step 1 to metrics.jsonl"),  # told in step 2's all-reduce
    ("train 1", ["train.max_steps=1"], "writing the record of step 1 to metrics.jsonl"),  # the loop's last step
    ("train 1", ["train.save_every=1", "train.max_steps=2"], "writing the record of step 1 to metrics.jsonl"),
    ("valid", ["train.max_epochs=1"], "writing the record and checkpoints of epoch 1"),
])
def test_a_failure_of_rank_zero_while_writing_metrics_stops_every_rank(tmp_path, data_dir, fail_at, extra, doing):
    """Rank 0 alone writes metrics.jsonl; where a record does not fit (a full disk), a training
    record (train.log_every=1: every step's) or an epoch's validation record, rank 0 stops with its
    error, which names the file, and the other rank at once with a copy naming it, both exiting
    non-zero, and no checkpoint is written past the record: a training record followed by another
    step is told in that step's all-reduce of the losses (no collective of its own), one at the
    loop's end or before save_every's last.pt at once. Before, a training record's failure stopped
    rank 0 alone and rank 1 failed in its next collective with gloo's "Connection closed by peer",
    and the OSError said "No space left on device" without the file."""
    port = _free_port()
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_zero_fails_logging,
                                 (2, port, fail_at, str(data_dir), str(tmp_path / "ddp"), str(out), *extra)) == [1, 1]
    error = f"OSError: [Errno 28] No space left on device: '{tmp_path / 'ddp' / 'metrics.jsonl'}'"
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == error
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == f"RankFailed: rank 0 failed {doing}: {error}"
    assert not (tmp_path / "ddp" / "last.pt").exists()


def _rank_zero_fails_logging_and_rank_one_is_terminated(rank: int, world: int, port: int, data_dir: str, save_dir: str,
                                                       out: str) -> None:
    """One rank of ``test_a_failed_record_told_with_an_interrupt_saves_nothing``: rank 0's write of
    step 1's record fails as on a full disk (:func:`_rank_zero_fails_logging`), and rank 1 gets a
    real SIGTERM (raising as under the CLI) inside step 2, the step whose all-reduce tells both."""
    import signal

    def raise_term(signum, frame):
        raise _Term

    signal.signal(signal.SIGTERM, raise_term)
    original = Trainer.train_step

    def terminated_second(self, group):
        out = original(self, group)
        if rank == 1 and self.step == 1:  # inside step 2 (self.step counts it after train_step)
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    Trainer.train_step = terminated_second
    try:
        _rank_zero_fails_logging(rank, world, port, "train 1", data_dir, save_dir, out, "train.max_steps=3")
    except _Term as exc:  # rank 1: its SIGTERM, raised from the failure it stopped with; the CLI exits 143
        assert rank == 1 and isinstance(exc.__cause__, RuntimeError), (rank, exc.__cause__)
        with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
            f.write(f"{type(exc.__cause__).__name__}: {exc.__cause__}")
        sys.exit(143)


def test_a_failed_record_told_with_an_interrupt_saves_nothing(tmp_path, data_dir):
    """Rank 0's record of step 1 fails and its failure rides in step 2's all-reduce, which also
    carries rank 1's SIGTERM: every rank stops with the failure, and no last.pt holds step 2 (the
    step trained after the failed record). The stop for the interrupt would have saved it. Rank 1,
    signalled, stops as one process does when its step fails during a signal: the signal raised from
    the failure (exit 143 under the CLI), not the failure alone (exit 1, the signal dropped)."""
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_zero_fails_logging_and_rank_one_is_terminated,
                                 (2, _free_port(), str(data_dir), str(tmp_path / "ddp"), str(out))) == [1, 143]
    error = f"OSError: [Errno 28] No space left on device: '{tmp_path / 'ddp' / 'metrics.jsonl'}'"
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == error
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == (
        f"RankFailed: rank 0 failed writing the record of step 1 to metrics.jsonl: {error}")
    assert not (tmp_path / "ddp" / "last.pt").exists()
    assert not (tmp_path / "ddp" / "metrics.jsonl").exists() or not (tmp_path / "ddp" / "metrics.jsonl").read_text()


def _signalled_and_failing_in_a_step(rank: int, world: int, port: int, signame: str, every: bool, data_dir: str,
                                     save_dir: str, out: str) -> None:
    """One rank of ``test_a_step_that_fails_during_a_signal_exits_as_the_signal``: ``cometnmt train``
    (cli.main, its SIGTERM handler included) where rank 0, and with ``every`` every rank (as torchrun
    passes its SIGTERM, or the terminal its Ctrl-C, to every rank), gets the real signal ``signame``
    inside step 2, and rank 0's step then fails; each rank's stderr goes to ``out``.RANK, and it
    exits with main's status."""
    import signal

    from cometnmt import cli

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    os.dup2(os.open(f"{out}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    original = Trainer.train_step

    def failing_second(self, group):
        result = original(self, group)
        if self.step == 1:  # inside step 2 (self.step counts it after train_step)
            if every or rank == 0:
                os.kill(os.getpid(), getattr(signal, signame))
            if rank == 0:
                raise RuntimeError("step 2 failed on rank 0")
        return result

    Trainer.train_step = failing_second
    sets = overrides(data_dir, save_dir, "train.max_steps=3", "train.accum_steps=1")
    code = cli.main(["train", str(REPO / "configs" / "tiny.yaml"), *(a for o in sets for a in ("--set", o))])
    sys.stderr.flush()
    sys.exit(code)


@pytest.mark.parametrize("signame, status, every",
                         [("SIGTERM", 143, True), ("SIGINT", 130, True), ("SIGTERM", 143, False)])
def test_a_step_that_fails_during_a_signal_exits_as_the_signal(tmp_path, data_dir, signame, status, every):
    """A step that fails while a Ctrl-C or SIGTERM is noted (``interrupts.deferred``): in one process the
    failure is reported and the signal's exit wins (130, 143; ``cli._say_failure``). A rank did not:
    fit's block under DDP kept the signal and let the failure out alone, so the rank exited 1 as if
    never signalled. Now it exits as one process does, the failure reported
    once, on its own rank, and nothing saved (the failure's step would be in it). The other rank says
    in one line that a rank left (it printed gloo's traceback of the all-reduce, below rank 0's error)."""
    out = tmp_path / "stderr"
    codes = _spawn_until_all_stop(_signalled_and_failing_in_a_step,
                                  (2, _free_port(), signame, every, str(data_dir), str(tmp_path / "ddp"), str(out)))
    errors = [(tmp_path / f"stderr.{rank}").read_text(encoding="utf-8") for rank in (0, 1)]
    assert codes[0] == status, errors[0]
    assert "RuntimeError: step 2 failed on rank 0" in errors[0]
    assert "interrupted at step 1 during a failure (RuntimeError); nothing saved" in errors[0]
    assert "interrupted before the first checkpoint; nothing to resume" in errors[0]
    # rank 1 learns of it in the step's all-reduce, as gloo's error for a peer that left: one line under
    # rank 0's error, not the collective's traceback; the signal's exit where it was signalled too, else 1
    assert codes[1] == (status if every else 1), errors[1]
    said = [line for line in errors[1].splitlines() if " INFO " not in line]
    assert said and said[-1].startswith(
        "cometnmt: error: rank 1 of 2 stopped training: another rank left the process group (Connection "), said
    assert said[-1].endswith("); that rank's own error says why") and "Traceback" not in errors[1], said
    assert "step 2 failed on rank 0" not in errors[1]
    if every:  # signalled too, rank 1 names the step rank 0 does (it named step 2, the one whose all-reduce failed)
        assert "interrupted at step 1 during a failure (PeerLeft); nothing saved" in errors[1], errors[1]
    assert not (tmp_path / "ddp" / "last.pt").exists()


def _rank_zero_fails_setting_up(rank: int, world: int, port: int, where: str, data_dir: str, save_dir: str,
                                out: str) -> None:
    """One rank of ``test_a_failure_of_rank_zero_while_setting_up_the_run_folder_stops_every_rank``:
    rank 0's data cannot be read (``where`` "data": a disk error, before the folder is made), its run
    folder ("folder"), train.log ("train_log"), config.yaml ("config") or, resuming, metrics.jsonl
    ("metrics": the records past last.pt removed) cannot be written (a full disk); each rank writes the error it stopped with to ``out``.RANK, then exits with it (non-zero)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if where == "data":
        run_module.read_splits = failing if rank == 0 else None  # rank 1 never reads them
    elif where == "folder":
        run_module.make_folder = failing if rank == 0 else None  # rank 1 never makes it
    elif where == "train_log":
        run_module._log_file = failing if rank == 0 else None  # rank 1 never opens it
    elif where == "config":
        run_module.write_text_file = failing if rank == 0 else None  # rank 1 never writes config.yaml
    else:
        Trainer._drop_records = failing if rank == 0 else None  # rank 1 never rewrites metrics.jsonl
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(
        data_dir, save_dir, "train.max_steps=2")), resume=where == "metrics")


@pytest.mark.parametrize("where, doing", [
    ("data", "reading the data"), ("folder", "making the run folder {}"), ("train_log", "opening {}/train.log"), ("config", "writing {}/config.yaml"),
    ("metrics", "removing the records past step 1 from {}/metrics.jsonl"),
])
def test_a_failure_of_rank_zero_while_setting_up_the_run_folder_stops_every_rank(tmp_path, data_dir, where, doing):
    """Rank 0 alone reads the data and then sets the run folder up (the folder, train.log, the stale
    temporaries' removal)
    and writes config.yaml before training (on a resume, it also removes the records past last.pt
    from metrics.jsonl); where that fails (a full disk), it stops with its error
    and the other rank at once with a copy naming the file, both exiting non-zero, nothing trained.
    Before, rank 0 stopped alone and rank 1 failed in its next collective (the wait for the data,
    DDP's first broadcast) with gloo's "Connection closed by peer"."""
    port = _free_port()
    if where == "metrics":  # a run to resume, its metrics.jsonl past its last.pt (a kill after step 2's record)
        train_in_process(data_dir, tmp_path / "ddp", "train.max_steps=1")
        with open(tmp_path / "ddp" / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": "train", "epoch": 1, "step": 2}) + "\n")
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_zero_fails_setting_up,
                                 (2, port, where, str(data_dir), str(tmp_path / "ddp"), str(out))) == [1, 1]
    doing = doing.format(tmp_path / "ddp")
    assert (tmp_path / "error.0").read_text(encoding="utf-8") == "OSError: [Errno 28] No space left on device"
    assert (tmp_path / "error.1").read_text(encoding="utf-8") == (
        f"RankFailed: rank 0 failed {doing}: OSError: [Errno 28] No space left on device")
    assert where == "metrics" or not (tmp_path / "ddp" / "last.pt").exists()
    assert where != "data" or not (tmp_path / "ddp").exists()  # the data are read before the folder is made


def _slow_rank_zero(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str, timeout: str,
                    slow_part: str) -> None:
    """One rank of ``test_the_wait_for_rank_zeros_data_is_limited_by_the_distributed_timeout``: rank
    0's preparation of the data (``slow_part`` "prepare") or its reading of the splits, before it
    makes the run folder ("read"), takes PREPARE_SECONDS longer; each rank writes the error it
    stopped with, or 'trained', to ``out``.RANK."""
    import time

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    name = "prepare_data" if slow_part == "prepare" else "read_splits"
    original = getattr(run_module, name)

    def slow(*args):
        time.sleep(PREPARE_SECONDS)  # as SentencePiece's training or the taggers on a large corpus (or a slow disk)
        return original(*args)

    setattr(run_module, name, slow if rank == 0 else None)  # rank 1 never reads nor prepares
    try:
        run_module.train(load_config(REPO / "configs" / "tiny.yaml", overrides(
            data_dir, save_dir, "train.max_steps=1", f"train.distributed_timeout_minutes={timeout}")))
        said = "trained"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
        f.write(said)


PREPARE_SECONDS = 20  # twice the short timeout below: ranks that start a few seconds apart on a loaded machine still join


@pytest.mark.parametrize("timeout, slow_part", [("0.17", "prepare"), ("1", "prepare"), ("0.17", "read")])  # 10 s, 60 s
def test_the_wait_for_rank_zeros_data_is_limited_by_the_distributed_timeout(tmp_path, data_dir, timeout, slow_part):
    """The ranks wait for rank 0's data preparation in one collective, for the process group's
    timeout: train.distributed_timeout_minutes. Shorter than the preparation, every rank stops with
    an error naming the key; longer, the run trains. Before, the process group had gloo's default
    30 minutes, which no key changed: a preparation that took longer (SentencePiece's training,
    the taggers on millions of lines) stopped the ranks with gloo's own timeout error. Rank 0's
    reading of the splits, before it makes the run folder, counts in its wait as the others'
    (counted from the preparation alone, rank 0 failed with gloo's error instead of the key's)."""
    port = _free_port()
    out = tmp_path / "said"
    torch.multiprocessing.spawn(_slow_rank_zero, nprocs=2, join=True,
                                args=(2, port, str(data_dir), str(tmp_path / "ddp"), str(out), timeout, slow_part))
    said = [(tmp_path / f"said.{rank}").read_text(encoding="utf-8") for rank in range(2)]
    if timeout == "1":
        assert said == ["trained", "trained"]
        assert load_checkpoint(tmp_path / "ddp" / "last.pt")["step"] == 1
        return
    assert said[1].startswith("ConfigError: config key 'train.distributed_timeout_minutes': rank 1 gave up waiting for "
                              "rank 0 to prepare the data (read the splits, build the codec, tag) after 0.17 minutes"), said[1]
    assert said[0].startswith("ConfigError: config key 'train.distributed_timeout_minutes': rank 0 prepared the data"), said[0]
    assert "longer than the 0.17 minutes a rank waits for the others" in said[0], said[0]


def _joining_alone(index: int, rank: int, port: int, out: str) -> None:
    """Rank ``rank`` of two, started alone: it joins the process group with train.distributed_timeout_minutes
    0.05 (3 seconds) and writes the error it stopped with, or 'joined', to ``out``."""
    from cometnmt.training.distributed import init_from_env

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        init_from_env("cpu", 0.05)
        said = "joined"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    with open(out, "w", encoding="utf-8") as f:
        f.write(said)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_waits_too_long_for_the_others_to_join_names_the_timeout_key(tmp_path, rank):
    """train.distributed_timeout_minutes also bounds joining the process group: a rank whose peers
    never start stops after it with an error naming the key, the rank and, on rank 0 (whose store
    counts them), how many ranks joined. Before, it stopped with torch's own text: rank 0 with
    "DistStoreError: Timed out after 4 seconds waiting for clients. 1/2 clients joined.", rank 1
    (no rank 0 to reach) with "DistNetworkError: The client socket has timed out after 3000ms ..."."""
    out = tmp_path / "said"
    torch.multiprocessing.spawn(_joining_alone, nprocs=1, join=True, args=(rank, _free_port(), str(out)))
    said = out.read_text(encoding="utf-8")
    assert said.startswith(f"ConfigError: config key 'train.distributed_timeout_minutes': rank {rank} of 2 gave up "
                           "joining the process group after "), said
    assert ("(1 of 2 ranks joined), the 0.05 minutes" if rank == 0 else "minutes, the 0.05 minutes") in said, said
    assert "check that every rank started and can reach rank 0 at MASTER_ADDR:MASTER_PORT (127.0.0.1:" in said, said


def _rank_one_dies_starting(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_rank_that_dies_before_joining_stops_rank_zero_at_the_timeout``: rank 1's
    config fails to load (a key its --set misspelt), so it exits before joining the process group;
    rank 0 trains with train.distributed_timeout_minutes 0.05 (3 seconds). Each rank writes the
    error it stopped with to ``out``.RANK, then exits with it (non-zero)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    extra = ["train.distributed_timeout_minutes=0.05"] + (["train.no_such_key=1"] if rank == 1 else [])
    try:
        cfg = load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, "train.max_steps=1", *extra))
    except Exception as exc:
        with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
            f.write(f"{type(exc).__name__}: {exc}")
        raise
    _train_and_record_the_error(rank, out, cfg)


def test_a_rank_that_dies_before_joining_stops_rank_zero_at_the_timeout(tmp_path, data_dir):
    """A rank that dies while starting (its config fails to load), before it joins the process group:
    rank 0, in run.train's join, stops after train.distributed_timeout_minutes with an error naming
    the key and that 1 of 2 ranks joined, and nothing is trained; it does not wait on (gloo's 30
    minutes, had the key not bounded the join)."""
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_one_dies_starting,
                                 (2, _free_port(), str(data_dir), str(tmp_path / "ddp"), str(out))) == [1, 1]
    assert (tmp_path / "error.1").read_text(encoding="utf-8").startswith("ConfigError: "), (tmp_path / "error.1").read_text()
    said = (tmp_path / "error.0").read_text(encoding="utf-8")
    assert said.startswith("ConfigError: config key 'train.distributed_timeout_minutes': rank 0 of 2 gave up joining "
                           "the process group after "), said
    assert "(1 of 2 ranks joined), the 0.05 minutes" in said, said
    assert not (tmp_path / "ddp" / "last.pt").exists()


# every registered architecture but the Transformer of the tests above, at test size
ARCHITECTURES = {
    "comet": ["model.arch=comet"],  # batch norm of unpadded batches in PyTorch's kernel, else masked
    "comet_temporal_conv_bn_length_tied": ["model.arch=comet", "model.comet.decoder=temporal_conv",  # decoder batch norm
                                           "model.comet.bn_length_bounds=[8,12]",  # per-length rows
                                           "model.comet.decoder_bn_length_bounds=[8,12]",  # keyed by source length
                                           "model.tie_embeddings=true"],  # a parameter two modules use
    "convs2s": ["model.arch=convs2s", "model.convs2s.embed_dim=32", "model.convs2s.enc_layers=[[32,3,2]]",
                "model.convs2s.dec_layers=[[32,3,2]]", "model.convs2s.out_embed_dim=32"],
    "rnn": ["model.arch=rnn", "model.rnn.cell=lstm", "model.rnn.embed_dim=32", "model.rnn.hidden_size=32",
            "model.rnn.attention=additive"],
    "transformer_pp": ["model.arch=transformer_pp", "data.src_lang=en", "data.tgt_lang=de", "model.enc_layers=3"],
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_architecture_trains_on_two_ranks_as_one_process(arch, tmp_path, data_dir):
    """One epoch of 7 micro-batches with dropout: two ranks (steps [0,1], [2,3], [4,5], [6] with
    rank 1 zero-weighted) against one process accumulating two. Everything the checkpoint keeps is
    compared, buffers included: COMET's batch-norm running statistics (and per-length counts) equal
    one process's because each rank records its micro-batches' statistics and all ranks replay them
    in order (distributed.SyncedRunningStatistics); broadcasting rank 0's, as DDP does by default,
    would leave rank 1's micro-batches out. Transformer++ adds its POS/NER tag losses."""
    extra = [*ARCHITECTURES[arch], "train.batch_tokens=1000", "train.max_epochs=1", DROPOUT]
    if arch == "transformer_pp":
        from test_transformer_pp import english_pipeline_or_skip

        english_pipeline_or_skip()
        extra.append(f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}")  # atomic writes: shared safely
    proc = torchrun(data_dir, tmp_path / "ddp", "train.accum_steps=1", *extra)
    try:
        one = train_in_process(data_dir, tmp_path / "one", "train.accum_steps=2", *extra)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    ddp = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert ddp["step"] == one["step"] == 4 and ddp["epoch"] == one["epoch"] == 1  # 7 micro-batches: 3 steps of 2 and 1
    assert_same_weights(ddp["model"], one["model"])
    assert train_losses(tmp_path / "ddp") == pytest.approx(train_losses(tmp_path / "one"), rel=1e-5)
    stats = [key for key in one["model"] if key.endswith("running_var")]
    assert bool(stats) == arch.startswith("comet")
    assert all(not torch.equal(one["model"][key], torch.ones_like(one["model"][key])) for key in stats)  # they moved
    if arch == "transformer_pp":  # the tag losses are logged as the window's means over all ranks' micro-batches
        assert train_losses(tmp_path / "ddp", "loss_pos") == pytest.approx(train_losses(tmp_path / "one", "loss_pos"), rel=1e-5)
        assert train_losses(tmp_path / "ddp", "loss_ner") == pytest.approx(train_losses(tmp_path / "one", "loss_ner"), rel=1e-5)


def test_compiled_accumulating_ranks_equal_one_eager_process(tmp_path, data_dir):
    """train.compile=true with DDP, each rank accumulating two micro-batches (the first under
    ``no_sync``, reached through the compiled wrapper): the weights equal those of one eager process
    accumulating the same four micro-batches a step, to compiled-vs-eager rounding. Only rank 0 logs."""
    ddp_dir, one_dir = tmp_path / "ddp", tmp_path / "one"
    more = ["data.max_train_pairs=600", f"train.max_steps={STEPS}"]  # 18 batches: the steps stay in epoch 1
    proc = torchrun(data_dir, ddp_dir, "train.accum_steps=2", "train.compile=true", *more)
    try:
        one = train_in_process(data_dir, one_dir, "train.accum_steps=4", *more)
        out, _ = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "training eagerly" not in out, out[-3000:]  # compiled for real, no eager fallback
    assert out.count("model transformer:") == 1, out[-3000:]  # reported by rank 0 alone
    ddp = load_checkpoint(ddp_dir / "last.pt")
    assert ddp["step"] == one["step"] == STEPS
    assert ddp["trainer"]["consumed"] == one["trainer"]["consumed"]
    # The keys' bias gets no gradient in exact arithmetic (softmax ignores a shift shared by all
    # keys), so Adam blows its rounding noise up to lr-sized steps: compared by shape only.
    noise_only = [key for key in one["model"] if key.endswith("k_proj.bias")]
    assert noise_only and ddp["model"].keys() == one["model"].keys()
    for key in one["model"]:
        assert ddp["model"][key].shape == one["model"][key].shape, key
        if key not in noise_only:
            torch.testing.assert_close(ddp["model"][key], one["model"][key], rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
    assert train_losses(ddp_dir) == pytest.approx(train_losses(one_dir), rel=1e-4)


def _accumulating_rank(rank: int, world: int, init_file: str, data_dir: str, save_dir: str, steps: int, accum: int, out: str) -> None:
    """One rank of ``test_accumulation_all_reduces_once_per_step``: a Trainer on DDP whose
    communication hook records, per all-reduce, whether it was the backward's last bucket."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        cfg = load_config(REPO / "configs" / "tiny.yaml", overrides(data_dir, save_dir, f"train.accum_steps={accum}"))
        codec, data = run_module.training_examples(cfg, read_split(cfg.data, "train"))
        run_module.seed_everything(cfg.train.seed)
        model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD)
        trainer = Trainer(cfg, model, codec, data, Examples([], [], [], []), torch.device("cpu"), DistInfo(rank, world, rank))
        last_buckets: list[bool] = []

        def counting_hook(state, bucket):
            last_buckets.append(bucket.is_last())
            return default_hooks.allreduce_hook(state, bucket)

        trainer.net.register_comm_hook(None, counting_hook)
        groups = trainer.epoch_batches(0)
        G = accum * world
        assert len(groups) >= steps * G, (len(groups), steps * G)
        for s in range(steps):
            trainer.train_step(groups[s * G : (s + 1) * G])
        torch.distributed.barrier()  # both ranks done before either tears gloo down (one CI run aborted in teardown)
        if rank == 0:
            with open(out, "w", encoding="utf-8") as f:
                json.dump({"last_buckets": last_buckets}, f)
    finally:
        torch.distributed.destroy_process_group()


def test_accumulation_all_reduces_once_per_step(tmp_path, data_dir):
    """Gradient accumulation without extra all-reduces: with two ranks accumulating two
    micro-batches each, DDP all-reduces its buckets once per optimizer step (the micro-batches
    before the last run under ``no_sync``); without it, once per micro-batch."""
    out = tmp_path / "hooks.json"
    torch.multiprocessing.spawn(
        _accumulating_rank, nprocs=2, join=True,
        args=(2, str(tmp_path / "init"), str(data_dir), str(tmp_path / "run"), 2, 2, str(out)),
    )
    hooks = json.loads(out.read_text(encoding="utf-8"))
    assert hooks["last_buckets"][-1] and sum(hooks["last_buckets"]) == 2  # one complete all-reduce per step, not per micro-batch


def test_an_interrupted_ddp_run_prints_a_torchrun_resume_command(tmp_path, monkeypatch, capsys):
    """Rank 0 of two, interrupted after last.pt: the command it prints resumes with torchrun and 2
    ranks (or names the accum_steps that keeps 2 x 3 micro-batches a step). Before, it printed the
    single-process `cometnmt train ... --resume`, which resumed with 3 micro-batches a step instead
    of the run's 6."""
    import shlex

    from cometnmt import cli

    def interrupted(cfg, **kwargs):  # a run that saved last.pt and was interrupted
        save_dir = tmp_path / "run"
        save_dir.mkdir()
        (save_dir / "last.pt").write_bytes(b"")
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "train", interrupted)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    sets = ["--set", "train.accum_steps=3", "--set", f"train.save_dir={tmp_path / 'run'}"]
    assert cli.main(["train", "configs/tiny.yaml", *sets]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    command = line.removeprefix("interrupted; continue with: ").split(";")[0]
    assert shlex.split(command) == ["torchrun", "--standalone", "--nproc_per_node=2", "-m", "cometnmt", "train",
                                    "configs/tiny.yaml", "--resume", *sets]
    assert "accum_steps x ranks stays 6 micro-batches a step" in line


def _rank_one_diverges(rank: int, world: int, port: int, data_dir: str, save_dir: str, out: str) -> None:
    """One rank of ``test_a_loss_that_is_not_a_number_on_one_rank_stops_every_rank``: rank 1's loss
    from step 3 on is NaN, and so is one of its gradients (rank 0's are numbers); each rank writes the
    error it stopped with to ``out``.RANK, then exits with it (non-zero)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    backward = Trainer.backward

    def diverging(self, group, n_tokens):
        total = backward(self, group, n_tokens)
        if rank == 1 and self.step + 1 >= 3:
            next(self.model.parameters()).grad.view(-1)[0] = float("nan")
            return total * float("nan")
        return total

    Trainer.backward = diverging
    _train_and_record_the_error(rank, out, load_config(REPO / "configs" / "tiny.yaml", overrides(
        data_dir, save_dir, "train.stopping=none", "train.save_every=2", "train.max_epochs=1")))


def test_a_loss_that_is_not_a_number_on_one_rank_stops_every_rank(tmp_path, data_dir):
    """Rank 1's loss of step 3 is NaN. The step's losses are summed over the ranks (each step's
    all-reduce), so both ranks read the NaN at step 3's record and stop there with the same
    TrainingDiverged, no collective of its own: neither waits for the other. last.pt stays step 2's,
    and rank 0 logged step 3's record (valid JSON)."""
    out = tmp_path / "error"
    assert _spawn_until_all_stop(_rank_one_diverges, (2, _free_port(), str(data_dir), str(tmp_path / "ddp"),
                                                      str(out))) == [1, 1]
    errors = [(tmp_path / f"error.{rank}").read_text(encoding="utf-8") for rank in (0, 1)]
    assert errors[0] == errors[1] and errors[0].startswith(
        "TrainingDiverged: training stopped at step 3 (epoch 1): the training loss is not a number (loss nan; first at "
        "step 3, 1 of the log window's steps)"), errors
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["step"] == 2
    lines = (tmp_path / "ddp" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3] and '"nonfinite": {"loss": "NaN"}' in lines[-1]
