"""An interrupted run resumed from its last checkpoint ends with exactly the weights of an
uninterrupted run with the same seed (dropout on, interruption mid-epoch); and the trainer hands
COMET its source mask only where a batch has padding."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
from pathlib import Path

import pytest
import torch

from cometnmt.training import run as run_module
from cometnmt.training.checkpoint import load_checkpoint
from cometnmt.training.trainer import Trainer

from conftest import tiny_train_cfg


def assert_same_weights(reference: dict, payload: dict) -> None:
    """Every weight of checkpoint ``payload`` equals ``reference``'s, bit for bit (named where not)."""
    for key, value in reference["model"].items():
        assert torch.equal(value, payload["model"][key]), key


# Transformer++ with its POS and NER tasks, tagged by an English pipeline (its log window holds the tag losses)
PP_TAGGED = ("model.enc_layers=3", "model.transformer_pp.conv_heads=2", "data.src_lang=en", "data.tgt_lang=de")


def tiny_cfg(save_dir, data_dir, arch="transformer", *more):
    return tiny_train_cfg(save_dir, data_dir, "train.max_epochs=2", f"model.arch={arch}", *more)


@pytest.mark.parametrize("arch", ["transformer", "comet", "transformer_pp"])
def test_resume_continues_exactly(tmp_path, data_dir, monkeypatch, arch):
    more = ()
    if arch == "transformer_pp":
        from test_transformer_pp import english_pipeline_or_skip

        english_pipeline_or_skip()
        more = (*PP_TAGGED, f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}")
    run_module.train(tiny_cfg(tmp_path / "full", data_dir, arch, *more))
    reference = load_checkpoint(tmp_path / "full" / "last.pt")

    calls = {"n": 0}
    original = Trainer.train_step

    def interrupt_on_seventh(self, group):
        calls["n"] += 1
        if calls["n"] == 7:  # the 2nd step of epoch 2 (5 steps of 2 micro-batches per epoch)
            raise KeyboardInterrupt
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", interrupt_on_seventh)
    cfg = tiny_cfg(tmp_path / "cut", data_dir, arch, *more)
    with pytest.raises(KeyboardInterrupt):
        run_module.train(cfg)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert saved["step"] == 6 and saved["trainer"]["consumed"] > 0  # stopped inside an epoch
    monkeypatch.setattr(Trainer, "train_step", original)
    run_module.train(cfg, resume=True)
    resumed = load_checkpoint(tmp_path / "cut" / "last.pt")

    assert resumed["step"] == reference["step"] and resumed["epoch"] == reference["epoch"] == 2
    assert_same_weights(reference, resumed)
    assert resumed["trainer"]["history"] == reference["trainer"]["history"]
    # the log window open at the interrupt (epoch 2's, logged at its end) is carried over: its
    # record covers the same steps as the uninterrupted run's (it covered only the steps after the resume)
    assert logged(tmp_path / "cut") == logged(tmp_path / "full")
    if arch == "transformer_pp":  # the tag losses of the window open at the interrupt are carried over too
        assert all({"loss_pos", "loss_ner"} <= set(r) for r in logged(tmp_path / "cut") if r["event"] == "train")


def logged(save_dir: Path) -> list[dict]:
    """metrics.jsonl without the timings (tokens/s), which no two runs share."""
    records = map(json.loads, (save_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines())
    return [{k: v for k, v in r.items() if k != "tgt_tokens_per_s"} for r in records]


def test_an_interrupt_during_validation_resumes_exactly(tmp_path, data_dir, monkeypatch):
    """Ctrl-C while epoch 1 is validated: before, the epoch was counted as done and its
    validation (metrics, best.pt, the stopping rule) was lost for good."""
    run_module.train(tiny_cfg(tmp_path / "full", data_dir))
    reference = load_checkpoint(tmp_path / "full" / "last.pt")
    original = Trainer.validate

    def interrupt(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "validate", interrupt)
    cfg = tiny_cfg(tmp_path / "cut", data_dir)
    with pytest.raises(KeyboardInterrupt):
        run_module.train(cfg)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert saved["epoch"] == 0 and saved["step"] == 5 and saved["trainer"]["history"] == []
    monkeypatch.setattr(Trainer, "validate", original)
    run_module.train(cfg, resume=True)
    resumed = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert resumed["trainer"]["history"] == reference["trainer"]["history"]
    assert [h["epoch"] for h in resumed["trainer"]["history"]] == [1, 2]
    assert_same_weights(reference, resumed)
    assert load_checkpoint(tmp_path / "cut" / "best.pt")["step"] == load_checkpoint(tmp_path / "full" / "best.pt")["step"]


def test_a_resume_after_a_kill_drops_the_records_past_its_checkpoint(tmp_path, data_dir, monkeypatch):
    """A run killed without saving (kill -9: here an exit no handler catches) inside step 4 of an
    epoch, with save_every=2 and a record per step: last.pt holds step 2, metrics.jsonl step 3 too.
    The resume trains step 3 again; before, its record then stood twice (steps 1, 2, 3, 3, 4, ...)."""
    overrides = ["train.log_every=1", "train.save_every=2", "train.accum_steps=1"]
    run_module.train(tiny_train_cfg(tmp_path / "full", data_dir, *overrides))
    original = Trainer.train_step
    calls = {"n": 0}

    def killed_in_fourth(self, group):
        calls["n"] += 1
        if calls["n"] == 4:
            raise SystemExit("killed")
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", killed_in_fourth)
    cfg = tiny_train_cfg(tmp_path / "cut", data_dir, *overrides)
    with pytest.raises(SystemExit):
        run_module.train(cfg)
    assert [r["step"] for r in logged(tmp_path / "cut")] == [1, 2, 3]
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["step"] == 2
    with open(tmp_path / "cut" / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"event": "train", "st')  # a record the kill cut in the middle of its write
    monkeypatch.setattr(Trainer, "train_step", original)
    run_module.train(cfg, resume=True)
    assert logged(tmp_path / "cut") == logged(tmp_path / "full")


class _Term(KeyboardInterrupt):
    """What the CLI's SIGTERM handler raises (cli._Terminated), without importing the CLI."""


@pytest.fixture
def sigterm_raises():
    """SIGTERM raises _Term, as under the CLI (left at its default, it would end pytest)."""
    def handler(signum, frame):
        raise _Term

    previous = signal.signal(signal.SIGTERM, handler)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("where", ["backward", "update"])
def test_a_signal_inside_a_step_stops_after_it_and_resumes_exactly(tmp_path, data_dir, monkeypatch, where):
    """A real Ctrl-C lands between any two bytecodes. After COMET's forward (its batch norms'
    running statistics updated) or after the optimizer step, the step used to be cut there and
    last.pt held half of it (the resume redid the step: statistics counted twice, or the weights
    updated twice). Now the step runs to its end and the run stops after it, its loss in the log
    window last.pt keeps: before, the interrupt came after the step was counted but before its loss
    and tokens joined the window, so the resumed run's record of steps 6-10 left step 7 out (and a
    record due at the step was never logged)."""
    run_module.train(tiny_cfg(tmp_path / "full", data_dir, "comet"))
    reference = load_checkpoint(tmp_path / "full" / "last.pt")
    calls = {"n": 0}
    original = getattr(Trainer, where)

    def signalled(self, *args):
        out = original(self, *args)
        calls["n"] += 1
        if calls["n"] == 7:  # the 2nd step of epoch 2
            signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(Trainer, where, signalled)
    cfg = tiny_cfg(tmp_path / "cut", data_dir, "comet")
    with pytest.raises(KeyboardInterrupt):
        run_module.train(cfg)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert saved["step"] == 7 and saved["trainer"]["consumed"] == 4  # the 7th step, whole
    monkeypatch.setattr(Trainer, where, original)
    run_module.train(cfg, resume=True)
    resumed = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert resumed["step"] == reference["step"]
    assert_same_weights(reference, resumed)
    assert logged(tmp_path / "cut") == logged(tmp_path / "full")


def test_a_second_signal_does_not_abort_the_interrupt_save(tmp_path, data_dir, monkeypatch, sigterm_raises, caplog):
    """`reproduce` sends SIGTERM to its trainings when Ctrl-C reaches it, and the terminal's SIGINT
    has usually reached them too: the SIGTERM landed inside the save of last.pt that the SIGINT
    had started, aborted the (atomic) write, and the run resumed from an older checkpoint."""
    from cometnmt.training import trainer as trainer_module

    calls = {"n": 0}
    original_step, original_save = Trainer.train_step, trainer_module.save_checkpoint

    def interrupt_on_seventh(self, group):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return original_step(self, group)

    def save(payload, path):
        if calls["n"] == 7:  # the interrupt's save: a second signal arrives while it writes
            signal.raise_signal(signal.SIGTERM)
        original_save(payload, path)

    monkeypatch.setattr(Trainer, "train_step", interrupt_on_seventh)
    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    with caplog.at_level(logging.WARNING, logger="cometnmt"), pytest.raises(KeyboardInterrupt):
        run_module.train(tiny_cfg(tmp_path / "cut", data_dir))
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["step"] == 6  # before: 5, epoch 1's end
    assert "a further interrupt arrived" in caplog.text


def test_two_signals_at_once_outside_a_step_still_save_last_pt(tmp_path, data_dir, monkeypatch, sigterm_raises, caplog):
    """The terminal's SIGINT and `reproduce`'s SIGTERM arrive together while epoch 1 validates
    (no step to defer them): SIGINT raised KeyboardInterrupt, and the SIGTERM, still pending, was
    raised at the next bytecode check, in the interrupt's handler before the save's guard was up:
    last.pt was never written, and the folder (metrics.jsonl, no last.pt) could be neither resumed
    nor trained afresh. Now a signal after the first is noted while the first is handled."""
    both = {signal.SIGINT, signal.SIGTERM}

    def validate(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, both)  # raise_signal: to this thread, pending together
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # SIGINT's KeyboardInterrupt here; SIGTERM pending

    monkeypatch.setattr(Trainer, "validate", validate)
    with caplog.at_level(logging.WARNING, logger="cometnmt"), pytest.raises(KeyboardInterrupt) as raised:
        run_module.train(tiny_cfg(tmp_path / "cut", data_dir))
    assert type(raised.value) is KeyboardInterrupt  # the first signal's (exit 130), not the SIGTERM's
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert saved["step"] == 5 and saved["epoch"] == 0 and saved["trainer"]["history"] == []
    assert "a further interrupt arrived" in caplog.text


@pytest.mark.parametrize("when", ["created", "two_while_written"])
def test_an_interrupted_config_write_leaves_no_temporary_file(tmp_path, data_dir, monkeypatch, sigterm_raises, when):
    """A run writes config.yaml (atomic_write) before its first step, outside any deferred block.
    "created": Ctrl-C lands while mkstemp creates the temporary file (it is raised right after the
    open, inside mkstemp, before atomic_write knew the name): .config.yaml.*.tmp stayed in the run
    folder. "two_while_written": SIGINT and SIGTERM arrive together while it is written: the
    SIGTERM was raised inside the clean-up, before the temporary file was removed."""
    both = {signal.SIGINT, signal.SIGTERM}
    real_open, real_fsync = os.open, os.fsync

    def open_then_signal(file, *args, **kwargs):
        fd = real_open(file, *args, **kwargs)
        if when == "created" and ".config.yaml." in str(file):
            signal.raise_signal(signal.SIGINT)
        return fd

    def fsync_then_two_signals(fd):
        real_fsync(fd)
        if when == "two_while_written" and stat.S_ISREG(os.fstat(fd).st_mode):  # config.yaml's, not a new folder's
            signal.pthread_sigmask(signal.SIG_BLOCK, both)
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # SIGINT raised here; SIGTERM pending

    monkeypatch.setattr(os, "open", open_then_signal)
    monkeypatch.setattr(os, "fsync", fsync_then_two_signals)
    with pytest.raises(KeyboardInterrupt):
        run_module.train(tiny_cfg(tmp_path / "cut", data_dir))
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["train.log"]  # no config.yaml, no .tmp


def test_atomic_write_fsyncs_the_folder_after_the_rename(tmp_path, monkeypatch):
    """The temporary file was fsync'd, then renamed over the path, but the folder holding the
    rename never was: after a power loss the path could name the old file (or none), a checkpoint
    written minutes before lost. The folder is now fsync'd after the rename."""
    import stat

    from cometnmt.atomic import atomic_write

    path = tmp_path / "run" / "last.pt"
    real_fsync, synced = os.fsync, []

    def noting_fsync(fd):
        info = os.fstat(fd)
        synced.append((stat.S_ISDIR(info.st_mode), info.st_ino, path.read_bytes() if path.exists() else None))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", noting_fsync)
    with atomic_write(path, "wb") as f:
        f.write(b"new")
    monkeypatch.undo()
    folder = os.stat(path.parent).st_ino
    first_file = next(i for i, (is_dir, _, _) in enumerate(synced) if not is_dir)
    assert synced[first_file][2] is None  # the file's bytes, before the rename
    assert (True, folder, b"new") in synced[first_file + 1:], synced  # its folder, after it


def test_new_folders_are_fsynced_into_their_parents(tmp_path, monkeypatch):
    """atomic_write made missing folders (a new run's save_dir) with mkdir and fsync'd only the
    innermost after its rename: the entries naming the new folders in their parents were never
    synced, so a power loss could lose a new run folder with the checkpoints fsync'd inside it.
    Each folder made is now fsync'd into its parent; existing ones are left alone."""
    import stat

    from cometnmt.atomic import atomic_write

    (tmp_path / "runs").mkdir()
    path = tmp_path / "runs" / "a" / "b" / "last.pt"
    real_fsync, synced = os.fsync, []

    def noting_fsync(fd):
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            synced.append(info.st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", noting_fsync)
    with atomic_write(path, "wb") as f:
        f.write(b"new")
    monkeypatch.undo()
    inode = {name: os.stat(folder).st_ino for name, folder in
             (("tmp", tmp_path), ("runs", tmp_path / "runs"), ("a", path.parents[1]), ("b", path.parent))}
    assert synced.index(inode["runs"]) < synced.index(inode["a"])  # 'a' made in runs, then 'b' in a
    assert inode["tmp"] not in synced  # runs existed: its parent is not touched
    assert synced.count(inode["b"]) == 1  # after the rename


def test_atomic_write_writes_through_a_link_and_keeps_a_files_permissions(tmp_path):
    """The rename replaced a symbolic link given as the path (translate -o LINK) with a new file,
    leaving the file it points to with its old content, and gave every file 0644: a private file
    (0600) became readable by all. Now a link is written through, as the shell's > does, and an
    existing file keeps its permissions; a new one is 0644, as before."""
    from cometnmt.atomic import atomic_write

    target = tmp_path / "real" / "out.txt"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with atomic_write(link) as f:
        f.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert not [p for p in tmp_path.rglob(".*.tmp")]
    private = tmp_path / "private.txt"
    private.write_text("secret\n")
    private.chmod(0o600)
    with atomic_write(private) as f:
        f.write("still secret\n")
    assert private.read_text() == "still secret\n" and (private.stat().st_mode & 0o777) == 0o600
    with atomic_write(tmp_path / "fresh.txt") as f:
        f.write("x")
    assert ((tmp_path / "fresh.txt").stat().st_mode & 0o777) == 0o644


def test_temporary_files_of_killed_writes_are_removed_at_the_next_start_but_not_live_ones(tmp_path, data_dir, caplog):
    """A process killed inside a checkpoint's write (kill -9) leaves its temporary file
    (.last.pt.XXXXXXXX.tmp), as large as the checkpoint, and nothing removed them: two kills, two
    files, and so on over a long run. A run's start or resume now removes those of its own files
    in its own folder whose writer is gone (no process holds the lock atomic_write takes); one
    another live process is writing is left alone (and named), as are files younger than a minute
    and other files' temporary files."""
    import subprocess
    import sys
    import time

    from conftest import REPO

    run_dir = tmp_path / "run"
    cfg = tiny_train_cfg(run_dir, data_dir)
    run_module.train(cfg)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    write = ("import os, signal, sys\nfrom cometnmt.atomic import atomic_write\n"
             "with atomic_write(sys.argv[1], 'wb') as f:\n    f.write(b'x' * 1000)\n    f.flush()\n"
             "    print('writing', flush=True)\n"
             "    os.kill(os.getpid(), signal.SIGKILL) if sys.argv[2] == 'kill' else sys.stdin.readline()\n")
    for _ in range(2):
        killed = subprocess.run([sys.executable, "-c", write, str(run_dir / "last.pt"), "kill"], env=env)
        assert killed.returncode == -signal.SIGKILL
    stale = sorted(run_dir.glob(".last.pt.*.tmp"))
    assert len(stale) == 2  # they add up
    live = subprocess.Popen([sys.executable, "-c", write, str(run_dir / "epoch099.pt"), "wait"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline() == "writing\n"
        (writing,) = run_dir.glob(".epoch099.pt.*.tmp")
        fresh = run_dir / ".best.pt.abcd1234.tmp"  # just made, not yet locked perhaps
        fresh.write_bytes(b"")
        other = run_dir / ".test.hyp.abcd1234.tmp"  # not the training's
        other.write_bytes(b"")
        old = time.time() - 120
        for path in (*stale, writing, other):
            os.utime(path, (old, old))
        with caplog.at_level(logging.INFO, logger="cometnmt"):
            run_module.train(cfg, resume=True)
        assert not any(path.exists() for path in stale)
        assert writing.exists() and fresh.exists() and other.exists()
        assert f"removed 2 temporary file(s) a killed run left: {stale[0].name}, {stale[1].name}" in caplog.text
        assert f"another process is writing {writing.name} in this run folder" in caplog.text
        live.stdin.write("\n")
        live.stdin.close()
        assert live.wait(60) == 0
    finally:
        live.kill()
        live.wait()
    assert (run_dir / "epoch099.pt").read_bytes() == b"x" * 1000 and not writing.exists()  # its write went through


def test_the_files_a_run_writes_are_those_whose_temporaries_a_restart_removes(tmp_path, data_dir):
    """The names of the files the training writes through atomic_write (checkpoints, metrics.jsonl,
    config.yaml) were restated as a regex in run.py, beside the literals that wrote them: a file
    renamed in one place kept its killed writes' temporary files for ever. They are now the trainer's
    and checkpoint module's own names: every file a run folder holds (but train.log, a log handler's)
    is one, the epochs' names among them as epoch_checkpoints reads them; others' files are not."""
    from cometnmt.training.checkpoint import EPOCH_CHECKPOINT, epoch_checkpoint_name

    run_dir = tmp_path / "run"
    run_module.train(tiny_train_cfg(run_dir, data_dir, "train.keep_checkpoints=1"))
    written = {p.name for p in run_dir.iterdir()} - {"train.log"}
    assert written == {"last.pt", "best.pt", "epoch001.pt", "metrics.jsonl", "config.yaml"}
    assert all(run_module._is_run_file(name) for name in written)
    assert not any(run_module._is_run_file(name) for name in ("train.log", "test.hyp", "done.json", "avg.pt",
                                                                "epoch_avg.pt", "last.pt.bak", "epoch1.ptx"))
    for epoch in (1, 99, 999, 1000):
        assert int(EPOCH_CHECKPOINT.fullmatch(epoch_checkpoint_name(epoch)).group(1)) == epoch


def test_an_interrupt_among_an_epochs_checkpoints_leaves_them_consistent(tmp_path, data_dir, monkeypatch):
    """Ctrl-C while best.pt was written at an epoch's end: last.pt already said that epoch was
    the best, but best.pt was never written (the run resumed without it). Now the epoch's
    checkpoints are written together and the interrupt is taken after them."""
    from cometnmt.training import trainer as trainer_module

    original_save = trainer_module.save_checkpoint

    def save(payload, path):
        if Path(path).name == "best.pt" and payload["epoch"] == 1:
            signal.raise_signal(signal.SIGINT)
        original_save(payload, path)

    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    with pytest.raises(KeyboardInterrupt):
        run_module.train(tiny_cfg(tmp_path / "cut", data_dir))
    last, best = load_checkpoint(tmp_path / "cut" / "last.pt"), load_checkpoint(tmp_path / "cut" / "best.pt")
    assert last["epoch"] == best["epoch"] == 1 and last["step"] == best["step"] == 5
    assert [h["epoch"] for h in last["trainer"]["history"]] == [1]


def test_a_kill_among_an_epochs_checkpoints_resumes_to_the_same_best_pt(tmp_path, data_dir, monkeypatch):
    """kill -9 (here an exit no handler catches) while best.pt was written at an epoch's end:
    last.pt, written first, already counted the epoch done and its validation the best, so the
    resume never wrote best.pt again and it kept epoch 1's model (here the run's last epoch: the
    resume had nothing left to train). last.pt is now written last: the resume trains the epoch
    again and ends with the uninterrupted run's best.pt."""
    from cometnmt.training import trainer as trainer_module

    run_module.train(tiny_cfg(tmp_path / "full", data_dir))
    reference = load_checkpoint(tmp_path / "full" / "best.pt")
    history = load_checkpoint(tmp_path / "full" / "last.pt")["trainer"]["history"]
    best_epoch = min(history, key=lambda h: h["val_loss"])["epoch"]
    assert reference["epoch"] == best_epoch == 2  # the loss falls in both epochs: epoch 2 is written as best
    original_save = trainer_module.save_checkpoint

    def killed_in_best_pt(payload, path):
        if Path(path).name == "best.pt" and payload["epoch"] == best_epoch:
            raise SystemExit("killed")
        original_save(payload, path)

    monkeypatch.setattr(trainer_module, "save_checkpoint", killed_in_best_pt)
    cfg = tiny_cfg(tmp_path / "cut", data_dir)
    with pytest.raises(SystemExit):
        run_module.train(cfg)
    monkeypatch.setattr(trainer_module, "save_checkpoint", original_save)
    run_module.train(cfg, resume=True)
    best = load_checkpoint(tmp_path / "cut" / "best.pt")
    assert best["step"] == reference["step"]
    assert_same_weights(reference, best)
    assert logged(tmp_path / "cut") == logged(tmp_path / "full")


def test_trainer_drops_the_source_mask_exactly_for_unpadded_batches(tmp_path, data_dir, monkeypatch):
    """Training batches without source padding reach COMET (unpadded_source_as_none) with
    src_pad_mask None, so its batch norm runs as F.batch_norm; every batch with padding keeps it."""
    from cometnmt.data.vocab import PAD
    from cometnmt.models.base import Seq2Seq

    seen = []
    original = Seq2Seq.forward

    def spy(self, src, src_pad_mask, tgt_in, **kwargs):  # features_only on the CPU's fused loss
        if self.training:
            seen.append((src_pad_mask is None, bool(src.eq(PAD).any())))
        return original(self, src, src_pad_mask, tgt_in, **kwargs)

    monkeypatch.setattr(Seq2Seq, "forward", spy)
    cfg = tiny_cfg(tmp_path / "run", data_dir, "comet")
    cfg.train.max_epochs, cfg.train.batch_tokens = 1, 150  # small batches: most hold one source length
    run_module.train(cfg)
    assert seen and any(none for none, _ in seen)  # one-length batches are the common case
    assert all(none != padded for none, padded in seen)  # None exactly where there is no padding


def test_an_auxiliary_loss_is_weighed_by_its_own_weight_only(tmp_path, data_dir, monkeypatch):
    """Transformer++'s tag losses enter the objective as weight * value, and nothing else: an
    auxiliary loss of value 0 with weight 0.25 trains exactly as none. Before, the loop over
    ``extra_losses()`` rebound the name of the rank's share of the step, so every step's objective
    and logged loss were scaled by the last tag weight (and an idle DDP rank's zero share was lost)."""
    from cometnmt.models.base import Seq2Seq

    run_module.train(tiny_cfg(tmp_path / "plain", data_dir))
    monkeypatch.setattr(Seq2Seq, "extra_losses", lambda self: {"aux": (torch.zeros(()), 0.25)})
    run_module.train(tiny_cfg(tmp_path / "aux", data_dir))
    plain, aux = load_checkpoint(tmp_path / "plain" / "last.pt"), load_checkpoint(tmp_path / "aux" / "last.pt")
    assert aux["trainer"]["history"] == plain["trainer"]["history"]

    def logged(run: str) -> list[float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["event"] == "train"]

    assert logged("aux") == logged("plain")
    for key, value in plain["model"].items():
        assert torch.equal(value, aux["model"][key]), key


def test_a_resume_on_changed_data_files_is_refused(tmp_path, data_dir, monkeypatch):
    """The config alone cannot tell that a data file was edited since the run started: the
    checkpoint records a digest of each split's pairs, and --resume on other sentences (which would
    not continue exactly) is an error naming the files; unchanged files resume."""
    import gzip

    from cometnmt.errors import ConfigError, DataError

    files = []
    for split, name, n in (("train", "train", 120), ("valid", "val", 10)):
        for side, lang in (("src", "de"), ("tgt", "en")):
            with gzip.open(data_dir / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                (tmp_path / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
            files.append(f"data.{split}_{side}={tmp_path / f'{split}.{lang}'}")
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, "data.corpus=files", *files, "train.max_steps=1")
    run_module.train(cfg)
    lines = (tmp_path / "train.de").read_text(encoding="utf-8").splitlines(keepends=True)
    edited = lines[:5] + ["Ein ganz anderer Satz.\n"] + lines[6:]
    (tmp_path / "train.de").write_text("".join(edited), encoding="utf-8")
    longer = tiny_train_cfg(tmp_path / "run", data_dir, "data.corpus=files", *files, "train.max_steps=2")
    with pytest.raises(DataError, match=r"train.de / .*train.en: the train sentences differ from those the run in"):
        run_module.train(longer, resume=True)
    (tmp_path / "train.de").write_text("".join(lines), encoding="utf-8")
    run_module.train(longer, resume=True)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 2
    # the same files named by relative paths (from their folder) are no change; it was refused as
    # "the config differs from the run ... in data.train_src"; another file still is one
    monkeypatch.chdir(tmp_path)
    relative = [f.split("=")[0] + "=" + Path(f.split("=", 1)[1]).name for f in files]
    assert relative[0] == "data.train_src=train.de"
    run_module.train(tiny_train_cfg(tmp_path / "run", data_dir, "data.corpus=files", *relative, "train.max_steps=2"), resume=True)
    (tmp_path / "copy.de").write_text("".join(lines), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"differs from the run in .* in data.train_src \('.*train.de' in the run, 'copy.de' now\)"):
        run_module.train(tiny_train_cfg(tmp_path / "run", data_dir, "data.corpus=files", "data.train_src=copy.de",
                                        *relative[1:], "train.max_steps=2"), resume=True)


def test_a_resume_on_other_tags_is_refused_and_the_resolved_tagger_is_recorded(tmp_path, data_dir, monkeypatch):
    """Transformer++ with pos_tagger 'auto': the checkpoint's config says only 'auto', which another
    machine may resolve to another pipeline (or version), and a --resume trained on with its other
    tags. The checkpoint records the tagger 'auto' resolved to and a digest of the tags; other tags
    are refused naming both taggers; the same tags resume, from a tagger named as the run's too."""
    from cometnmt.data import tagging
    from cometnmt.errors import DataError

    class Tagger:
        tasks = ("pos",)

        def __init__(self, name, label):
            self.name, self.label = name, label

        def annotate(self, texts):
            return {"pos": [[(0, len(t), self.label)] for t in texts]}

    def tagged_by(name, label="NOUN"):
        monkeypatch.setattr(tagging, "build_annotators", lambda c, lang: [Tagger(name, label)])

    def cfg(steps, *more):
        return tiny_train_cfg(tmp_path / "run", data_dir, "model.arch=transformer_pp", "model.transformer_pp.tasks=[pos]",
                              "model.transformer_pp.conv_heads=2", f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}",
                              f"train.max_steps={steps}", *more)

    tagged_by("hanta:ger@1.1.2")  # what 'auto' finds here: no German spaCy pipeline is installed
    run_module.train(cfg(1))
    payload = load_checkpoint(tmp_path / "run" / "last.pt")
    assert payload["config"]["model"]["transformer_pp"]["pos_tagger"] == "auto"
    assert payload["tags"]["pos"]["tagger"] == "hanta:ger@1.1.2"
    tagged_by("spacy:de_core_news_sm@3.8.0", "VERB")  # 'auto' on a machine with the German pipeline
    with pytest.raises(DataError, match=r"--resume: the POS tags of the training sentences differ from those the run in "
                                        r".*last.pt was trained on \(tagged by hanta:ger@1.1.2; now by spacy:de_core_news_sm@3.8.0\)"):
        run_module.train(cfg(2), resume=True)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 1
    tagged_by("hanta:ger@1.1.2")  # the run's tagger, named instead of 'auto'
    run_module.train(cfg(2, "model.transformer_pp.pos_tagger=hanta"), resume=True)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 2


def test_a_resume_may_keep_its_tags_in_another_cache_folder(tmp_path, data_dir):
    """model.transformer_pp.tag_cache_dir says where annotations are cached, not what is trained (a
    cache file is keyed by the sentences and the annotator): a resume naming another folder (on
    another machine, say) was refused as 'the config differs from the run in
    model.transformer_pp.tag_cache_dir'. Other model keys still are."""
    from cometnmt.config import to_dict
    from cometnmt.errors import ConfigError
    from cometnmt.training.checkpoint import FORMAT_VERSION

    def cfg(folder, *more):
        return tiny_train_cfg(tmp_path / "run", data_dir, "model.arch=transformer_pp", "model.enc_layers=3",
                              f"model.transformer_pp.tag_cache_dir={folder}", *more)

    (tmp_path / "run").mkdir()
    state = {"optimizer": {}, "scheduler": {}, "scaler": {}, "rng": {}, "step": 0, "epoch": 0,  # what a resume reads
             "trainer": {"consumed": 0, "history": [], "best": None, "stale": 0, "finished": False}}
    torch.save({"format_version": FORMAT_VERSION, "config": to_dict(cfg(tmp_path / "a")), "codec": {}, "model": {}, **state},
               tmp_path / "run" / "last.pt")
    assert run_module._check_save_dir(cfg(tmp_path / "b"), resume=True)["config"]["model"]["transformer_pp"][
        "tag_cache_dir"] == str(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"in model.transformer_pp.pos_weight \(1.0 in the run, 2.0 now\)"):
        run_module._check_save_dir(cfg(tmp_path / "b", "model.transformer_pp.pos_weight=2.0"), resume=True)


def test_init_from_starts_a_new_run_from_trained_weights(tmp_path, data_dir, monkeypatch, caplog):
    """train --init-from: a new run (fresh optimizer, schedule and step count) starts from another
    run's weights and vocabularies, here on other sentences; keys that would not fit are errors
    naming them, before anything is written to the new folder."""
    from cometnmt.errors import ConfigError

    run_module.train(tiny_train_cfg(tmp_path / "base", data_dir))
    base = load_checkpoint(tmp_path / "base" / "best.pt")
    other = ["data.train_split=val", "data.max_train_pairs=200", "train.max_steps=1", "model.dropout=0.3"]
    seen = {}
    original = Trainer.fit

    def fit_from_the_start(self):  # what the new run starts with
        seen["weights"] = {k: v.clone() for k, v in self.model.state_dict().items()}
        seen["step"], seen["history"] = self.step, list(self.history)
        return original(self)

    monkeypatch.setattr(Trainer, "fit", fit_from_the_start)
    with caplog.at_level(logging.INFO, logger="cometnmt"):
        run_module.train(tiny_train_cfg(tmp_path / "tuned", data_dir, *other), init_from=tmp_path / "base" / "best.pt")
    monkeypatch.setattr(Trainer, "fit", original)
    shares = re.search(r"tokens the checkpoint's vocabularies lack \(<unk>\): training ([\d.]+)% of source, ([\d.]+)% of "
                       r"target", caplog.text)  # the new data's words the old vocabularies lack: said, not silent
    assert shares and 0 < float(shares.group(1)) < 100 and 0 < float(shares.group(2)) < 100
    assert seen["step"] == 0 and seen["history"] == []
    for key, value in base["model"].items():
        assert torch.equal(seen["weights"][key], value), key
    tuned = load_checkpoint(tmp_path / "tuned" / "last.pt")
    assert tuned["step"] == 1 and tuned["codec"] == base["codec"]  # base's vocabularies, on other data
    assert tuned["init_from"] == str(tmp_path / "base" / "best.pt")
    assert not all(torch.equal(tuned["model"][k], v) for k, v in base["model"].items())  # and it trained

    for overrides, needle in ((["model.d_model=32", "model.d_ff=64"], "its weights do not fit this model"),
                              (["data.min_freq=2"], "data.min_freq (3 in the checkpoint, 2 now)"),
                              # the shapes fit, but two trained matrices cannot load into one (the last would win)
                              (["model.tie_embeddings=true"], "config key 'model.tie_embeddings': true, but the checkpoint")):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            run_module.train(tiny_train_cfg(tmp_path / "bad", data_dir, *overrides), init_from=tmp_path / "base" / "best.pt")
        assert not (tmp_path / "bad").exists()  # refused before the folder was made
    with pytest.raises(ConfigError, match="give one of them"):
        run_module.train(tiny_train_cfg(tmp_path / "tuned", data_dir, *other), resume=True, init_from=tmp_path / "base" / "best.pt")


def test_resuming_a_finished_run_says_so(tmp_path, data_dir, caplog):
    """--resume on a run that reached train.max_epochs trains nothing and says why (it logged
    'resumed from step N' as if training went on)."""
    cfg = tiny_train_cfg(tmp_path / "run", data_dir)
    first = run_module.train(cfg)
    with caplog.at_level(logging.INFO, logger="cometnmt"):
        again = run_module.train(tiny_train_cfg(tmp_path / "run", data_dir), resume=True)
    assert again["steps"] == first["steps"] and again["epochs"] == first["epochs"] == 1
    assert f"the run had already finished at step {first['steps']}, epoch 1 (train.max_epochs): nothing to train" in caplog.text
    assert "resumed from step" not in caplog.text


def test_a_resume_without_a_readable_last_pt_names_the_checkpoints_to_continue_from(tmp_path, data_dir):
    """--resume on a run whose last.pt is zero bytes (or gone) stopped with an error naming last.pt
    only, while the folder's epoch checkpoints and best.pt, each the run's whole state at its step,
    could continue it. The error now names those that load, newest first, and the command that
    continues from the newest; following it continues exactly. Not done by itself: that would drop
    the training after that step unasked."""
    import shutil
    import shlex

    from cometnmt.errors import CheckpointError

    run_dir = tmp_path / "run"
    cfg = tiny_train_cfg(run_dir, data_dir, "train.max_epochs=2", "train.keep_checkpoints=2")
    run_module.train(cfg)
    reference = load_checkpoint(run_dir / "last.pt")
    best_step = load_checkpoint(run_dir / "best.pt")["step"]
    assert reference["step"] == 10 and best_step in (5, 10)
    (run_dir / "last.pt").write_bytes(b"")
    data = (run_dir / "epoch002.pt").read_bytes()
    (run_dir / "epoch002.pt").write_bytes(data[: len(data) // 2])  # truncated too: not offered

    with pytest.raises(CheckpointError) as info:
        run_module.train(cfg, resume=True)
    message = str(info.value)
    assert message.startswith(f"--resume: {run_dir / 'last.pt'}: not a checkpoint; a PyTorch checkpoint is a zip "
                              "archive, this file is empty; the run folder holds checkpoints that load: "), message
    shown = [f"best.pt (step {best_step}, {best_step // 5} epoch{'s' * (best_step == 10)} done)", "epoch001.pt (step 5, 1 epoch done)"]
    assert ", ".join(shown if best_step == 10 else shown[::-1]) in message, message  # newest first; epoch002.pt not named
    newest = "best.pt" if best_step == 10 else "epoch001.pt"
    command = shlex.join(["cp", str(run_dir / newest), str(run_dir / "last.pt")])
    assert (f"to continue from {newest}, copy it over last.pt ({command}) and run the same command again with --resume "
            "(the steps after it are trained again)") in message
    with pytest.raises(CheckpointError, match=r"and call train again with resume=True \(the steps"):
        run_module.train(cfg, resume=True, flags=False)
    (run_dir / "last.pt").unlink()
    with pytest.raises(CheckpointError, match=rf"^--resume: no checkpoint at .*last.pt \(train.save_dir=.*\); the run folder "
                       rf"holds checkpoints that load: .*{re.escape(command)}"):
        run_module.train(cfg, resume=True)

    # as told, but from epoch 1 (best.pt may be epoch 2's, with nothing left to train): epoch 2 again, exactly
    shutil.copy(run_dir / "epoch001.pt", run_dir / "last.pt")
    run_module.train(cfg, resume=True)
    resumed = load_checkpoint(run_dir / "last.pt")
    assert resumed["step"] == 10 and resumed["trainer"]["history"] == reference["trainer"]["history"]
    assert_same_weights(reference, resumed)


def test_a_resume_from_an_averaged_checkpoint_says_it_lacks_the_training_state(tmp_path, data_dir):
    """An average (weights alone) copied over last.pt, or among the epoch checkpoints: --resume read
    the data, built the model and then failed in Trainer.load_state_dict with a traceback ending in
    KeyError: 'optimizer', and the error of a missing last.pt offered such a file to continue from.
    Now the error names last.pt and what it lacks, before any data is read, and offers only the
    checkpoints that hold a run's whole state."""
    import shutil

    import cometnmt
    from cometnmt.errors import CheckpointError

    run_dir = tmp_path / "run"
    cfg = tiny_train_cfg(run_dir, data_dir, "train.max_epochs=2", "train.keep_checkpoints=2")
    run_module.train(cfg)
    avg = cometnmt.average_checkpoints([run_dir / "epoch001.pt", run_dir / "epoch002.pt"], tmp_path / "avg.pt")
    shutil.copy(avg, run_dir / "last.pt")
    shutil.copy(avg, run_dir / "epoch003.pt")  # no run's state: not offered
    more = tiny_train_cfg(run_dir, data_dir, "train.max_epochs=3", "train.keep_checkpoints=2")
    with pytest.raises(CheckpointError) as info:
        run_module.train(more, resume=True)
    message = str(info.value)
    assert message.startswith(f"--resume: {run_dir / 'last.pt'}: it is an average of 2 checkpoints (cometnmt average), "
                              "which keeps the weights alone: it lacks the training state a resume continues "
                              "(optimizer, scheduler, scaler, rng, trainer); --init-from "), message
    assert "holds checkpoints that load: epoch002.pt (step 10" in message and "epoch003.pt" not in message, message
    assert not (run_dir / "train.log").read_text(encoding="utf-8").count("resumed from")
    payload = load_checkpoint(run_dir / "epoch002.pt")
    del payload["trainer"]["stale"]  # a hand-edited file
    torch.save(payload, run_dir / "last.pt")
    with pytest.raises(CheckpointError, match=r"not a checkpoint the trainer wrote: it lacks the training state a resume "
                       r"continues \(trainer.stale\); init_from="):
        run_module.train(more, resume=True, flags=False)


def test_the_trainers_resume_keys_are_what_load_state_dict_reads(tmp_path, data_dir):
    """Trainer.missing_state lists the keys load_state_dict reads with no default; the resume's
    refusal names them. Bound here to what load_state_dict does: without any listed key it fails,
    and without any other key (beyond the weights) it loads, so a key added to state_dict and read
    without a default must be listed, or this fails."""
    import copy

    from cometnmt.data.pipeline import encode_pairs, read_split

    run_dir = tmp_path / "run"
    cfg = tiny_train_cfg(run_dir, data_dir, "train.max_epochs=1")
    run_module.train(cfg)
    payload = load_checkpoint(run_dir / "last.pt")
    assert Trainer.missing_state(payload) == []
    codec, train = run_module.training_examples(cfg, read_split(cfg.data, "train"))
    valid = encode_pairs(codec, read_split(cfg.data, "valid"), None)
    model = run_module.build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), run_module.PAD)
    trainer = Trainer(cfg, model, codec, train, valid, torch.device("cpu"))

    def loads(without: str) -> bool:
        edited = copy.deepcopy(payload)
        section, _, key = without.rpartition(".")
        del (edited[section] if section else edited)[key]
        try:
            trainer.load_state_dict(edited)
        except (KeyError, TypeError):
            return False
        return True

    keys = [key for key in payload if key not in ("model", "config", "codec")]
    keys += [f"trainer.{key}" for key in payload["trainer"]]
    listed = set(Trainer.RESUME_KEYS) | {f"trainer.{key}" for key in Trainer.RESUME_TRAINER_KEYS}
    assert {key for key in keys if not loads(key)} == listed


def test_a_run_folder_another_process_trains_in_is_refused(tmp_path, data_dir):
    """A reproduce stopped by kill -9 leaves its training running; rerun, it started a second
    trainer in the same folder, refused as a run already there ("pass --resume": the wrong cause)
    or, with --resume, writing over the first's checkpoints. A trainer now holds a lock on its run
    folder (flock, dropped by the kernel when the process ends, however): another is refused
    naming the folder, before anything is read or written, and goes ahead once it is free."""
    import subprocess
    import sys

    from cometnmt.errors import ConfigError

    run_dir = tmp_path / "run"
    run_module.train(tiny_train_cfg(run_dir, data_dir, "train.max_epochs=1"))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(run_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        more = tiny_train_cfg(run_dir, data_dir, "train.max_epochs=2")
        for resume in (True, False):
            with pytest.raises(ConfigError, match=rf"^config key 'train.save_dir': {re.escape(str(run_dir))} is in use: "
                               "another process is training there"):
                run_module.train(more, resume=resume)
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # nothing written
    finally:
        holder.kill()
        holder.wait()
    run_module.train(more, resume=True)  # the lock gone with its process
    assert load_checkpoint(run_dir / "last.pt")["epoch"] == 2


def test_a_resume_refuses_train_keys_the_checkpoint_fixes(tmp_path, data_dir):
    """--resume --set train.lr=10 trained on at the run's rate (the optimizer's state holds it)
    while config.yaml recorded 10; a new seed or batch size would silently reshuffle the epoch the
    run stopped in. Such keys are refused by name; max_epochs, say, may still change. A resume with
    nothing to train leaves config.yaml as it was (it recorded max_epochs: 1 for a 2-epoch run)."""
    from cometnmt.errors import ConfigError

    run_dir = tmp_path / "run"
    run_module.train(tiny_train_cfg(run_dir, data_dir, "train.max_epochs=1"))
    for override, shown in [("train.lr=10.0", "train.lr (0.001 in the run, 10.0 now)"),
                            ("train.seed=7", "train.seed (1 in the run, 7 now)"),
                            ("train.batch_tokens=900", "train.batch_tokens (600 in the run, 900 now)"),
                            ("train.schedule=inverse_sqrt", "train.schedule ('constant' in the run, 'inverse_sqrt' now)")]:
        with pytest.raises(ConfigError, match=re.escape(shown)):
            run_module.train(tiny_train_cfg(run_dir, data_dir, "train.max_epochs=2", override), resume=True)
    with pytest.raises(ConfigError, match="start a new run from its weights with init_from"):
        run_module.train(tiny_train_cfg(run_dir, data_dir, "train.lr=10.0"), resume=True, flags=False)

    run_module.train(tiny_train_cfg(run_dir, data_dir, "train.max_epochs=2", "train.clip_norm=0.5"), resume=True)
    saved = (run_dir / "config.yaml").read_text(encoding="utf-8")
    assert "max_epochs: 2" in saved and "clip_norm: 0.5" in saved
    run_module.train(tiny_train_cfg(run_dir, data_dir, "train.max_epochs=1"), resume=True)  # nothing to train
    assert (run_dir / "config.yaml").read_text(encoding="utf-8") == saved


def test_a_resume_may_turn_fp16_on(tmp_path, data_dir):
    """train.precision may change on a resume (README): a run trained in fp32, resumed with fp16,
    goes on with a fresh loss scaler. Before, the fp32 run's empty scaler state was loaded into the
    enabled scaler and the resume failed with torch's RuntimeError ("The source state dict is
    empty, possibly because it was saved from a disabled instance of GradScaler")."""
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=2"))
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=3", "train.precision=fp16"), resume=True)
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == 3 and last["scaler"]["scale"] == 2.0**16


def test_a_resume_on_another_device_is_warned_of_naming_both(tmp_path, data_dir, caplog):
    """A run trained on CUDA and resumed on the CPU (or back) cannot continue bit-exactly (other
    kernels, other random streams), and was resumed without a word. The checkpoint now records the
    device it was written on, and a resume on another warns once, naming both; a resume on the
    same device does not."""
    from cometnmt.training.checkpoint import save_checkpoint

    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=1", "train.device=cpu"))
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["device"] == "cpu"
    with caplog.at_level(logging.WARNING, logger="cometnmt"):
        run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=2", "train.device=cpu"), resume=True)
    assert "resumes on" not in caplog.text
    last = load_checkpoint(tmp_path / "last.pt")
    save_checkpoint({**last, "device": "cuda (NVIDIA H100 80GB HBM3)"}, tmp_path / "last.pt")  # as a GPU run wrote it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cometnmt"):
        run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=3", "train.device=cpu"), resume=True)
    warned = [r.getMessage() for r in caplog.records if "resumes on" in r.getMessage()]
    assert warned == [f"{tmp_path / 'last.pt'}: the run trained on cuda (NVIDIA H100 80GB HBM3) and resumes on cpu; "
                      "it goes on, but not bit-exactly as it would on cuda (NVIDIA H100 80GB HBM3)"], caplog.text
    assert "\n" not in warned[0] and load_checkpoint(tmp_path / "last.pt")["step"] == 3


def test_deferred_delivers_the_first_signal_after_the_block_and_nests():
    """cometnmt.interrupts.deferred: the block runs to its end, then the interrupt is raised; a
    nested block hands its signal to the outer one; redeliver=False drops it; handlers come back."""
    from cometnmt.interrupts import deferred

    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            with deferred():
                signal.raise_signal(signal.SIGINT)
                done.append("inner")
            done.append("outer")
    assert done == ["inner", "outer"] and signal.getsignal(signal.SIGINT) is before
    with deferred(redeliver=False) as noted:
        signal.raise_signal(signal.SIGINT)
    assert noted == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is before


def test_deferred_delivers_its_signal_when_the_block_raises_from_the_failure():
    """A deferred block that raises delivers the signal it noted (it was dropped: the failure went
    on alone, and a caller handling it went on as if no signal came): the handler's interrupt is
    raised from the failure, which stays its cause; a nested block hands it to the outer one, which
    delivers it as it ends, the failure still going through it; redeliver=False drops it."""
    from cometnmt.interrupts import deferred

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as raised:
        with deferred():
            signal.raise_signal(signal.SIGINT)
            raise OSError(28, "No space left on device")
    assert isinstance(raised.value.__cause__, OSError) and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt) as raised:
        try:
            with deferred():
                with deferred() as inner:
                    signal.raise_signal(signal.SIGINT)
                    raise OSError(28, "No space left on device")
        except OSError:  # the outer block is not where the interrupt stops: the caller's handler of the failure
            pytest.fail("the failure passed without its interrupt")
    assert inner == [signal.SIGINT] and isinstance(raised.value.__cause__, OSError)
    with pytest.raises(OSError):
        with deferred(redeliver=False) as noted:
            signal.raise_signal(signal.SIGINT)
            raise OSError(28, "No space left on device")
    assert noted == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is before


def test_an_interrupt_during_a_failed_checkpoint_write_stops_the_run_saving_nothing(tmp_path, data_dir, monkeypatch):
    """Ctrl-C while save_every's last.pt write fails (a full disk): the run stops with a
    KeyboardInterrupt raised from the OSError (it stopped with the OSError alone, the interrupt
    lost), and fit saves no last.pt for it, as for the failure alone; the records written stay, and
    train.log names the failure."""
    from cometnmt.training import trainer as trainer_module

    original = trainer_module.save_checkpoint
    calls = []

    def failing(state, path):
        calls.append(path.name)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # noted by save's deferred block
            raise OSError(28, "No space left on device", str(path))
        return original(state, path)

    monkeypatch.setattr(trainer_module, "save_checkpoint", failing)
    with pytest.raises(KeyboardInterrupt) as raised:
        run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.save_every=2", "train.log_every=1"))
    assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.errno == 28
    assert calls == ["last.pt"] and not (tmp_path / "last.pt").exists()
    steps = [r["step"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines())]
    assert steps == [1, 2]
    # train.log says what failed, as for the failure alone (it said nothing: the interrupt was not logged)
    logged = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert "the run stopped: [Errno 28] No space left on device" in logged, logged[-2000:]


def test_the_cli_reports_the_failure_an_interrupt_came_during(tmp_path, monkeypatch, capsys):
    """`cometnmt train` stopped by an interrupt raised from a failure (interrupts.deferred) prints
    the failure as it would alone, then the interrupt's line; the exit is the interrupt's (130)."""
    from cometnmt import cli
    from cometnmt.errors import CheckpointError
    from cometnmt.training import run

    def train(cfg, **kwargs):
        try:
            raise CheckpointError(f"{tmp_path / 'last.pt'}: cannot write")
        except CheckpointError as exc:
            raise KeyboardInterrupt from exc

    monkeypatch.setattr(run, "train", train)
    assert cli.main(["train", "configs/tiny.yaml", "--set", f"train.save_dir={tmp_path}"]) == 130
    err = capsys.readouterr().err
    assert f"cometnmt: error: {tmp_path / 'last.pt'}: cannot write\n" in err
    assert err.index("cannot write") < err.index("interrupted"), err


def test_noted_until_taken_hands_its_signals_to_the_handlers_nested_in_it():
    """cometnmt.interrupts.noted_until_taken (the DDP set-up's, handed to Trainer.fit): signals are
    noted until take(), which returns them, ignored ones with them; handlers installed inside it
    (fit's first_raises and deferred) then deliver through it to the handlers before it, so the
    first raises a KeyboardInterrupt; on leaving, the handlers before it come back. A deferred block
    nested over it, as before, would have delivered to a handler that only notes."""
    from cometnmt.interrupts import deferred, first_raises, noted_until_taken, raise_noted

    before = signal.getsignal(signal.SIGINT)
    with noted_until_taken() as hand:
        signal.raise_signal(signal.SIGINT)  # between the set-up's last agreement and fit's handlers
        with pytest.raises(KeyboardInterrupt):
            with first_raises():
                with deferred(redeliver=False) as pending:
                    pending.extend(hand.take())
                    signal.raise_signal(signal.SIGTERM)  # fit's own: noted by its deferred
                assert pending == [signal.SIGINT, signal.SIGTERM]
                raise_noted(pending)  # as fit raises a rank's own signal
        assert hand.ignored == set() and hand.noted == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a run started in the background
    try:
        with noted_until_taken() as hand:
            signal.raise_signal(signal.SIGINT)
            assert hand.ignored == {signal.SIGINT} and hand.take() == [signal.SIGINT]
            signal.raise_signal(signal.SIGINT)  # after take(): to SIG_IGN, nothing raised
    finally:
        signal.signal(signal.SIGINT, before)


def test_init_from_with_other_batch_norm_length_buckets_warns(tmp_path, data_dir, caplog):
    """--init-from with other model.comet.bn_length_bounds of as many buckets: the weights fit, but
    each bucket's statistics were trained on other lengths, which the log says."""
    comet = ["model.arch=comet", "train.max_steps=1"]
    run_module.train(tiny_train_cfg(tmp_path / "base", data_dir, *comet, "model.comet.bn_length_bounds=[4, 8]"))
    with caplog.at_level(logging.INFO, logger="cometnmt"):
        run_module.train(tiny_train_cfg(tmp_path / "same", data_dir, *comet, "model.comet.bn_length_bounds=[4, 8]"),
                         init_from=tmp_path / "base" / "last.pt")
        assert "differs from the checkpoint's" not in caplog.text
        run_module.train(tiny_train_cfg(tmp_path / "tuned", data_dir, *comet, "model.comet.bn_length_bounds=[4, 9]"),
                         init_from=tmp_path / "base" / "last.pt")
    assert "model.comet.bn_length_bounds [4, 9] differs from the checkpoint's [4, 8]" in caplog.text


def test_the_saved_config_loads_back_as_it_was(tmp_path, data_dir, monkeypatch):
    """config.yaml was written with yaml.safe_dump, which leaves a string such as the name '1e5'
    unquoted; cometnmt's loader reads 1e5 as the number 100000.0, so the run's own config.yaml did
    not load (`cometnmt train run/config.yaml`, reproduce's and compare's test split of a run):
    "config key 'name': expected a string, got 100000.0"."""
    from cometnmt.config import load_config
    from cometnmt.experiments import run_test_split

    monkeypatch.setattr(Trainer, "fit", lambda self: {})  # the config is written before the first step
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, "name='1e5'", "data.src_lang='de'", "decode.temperature=1e-3")
    run_module.train(cfg)
    saved = tmp_path / "run" / "config.yaml"
    assert "name: '1e5'" in saved.read_text(encoding="utf-8")
    assert load_config(saved) == cfg
    assert run_test_split(tmp_path / "run", 3)[2].name == "1e5"


def test_an_interrupt_after_the_weights_diverged_keeps_the_last_good_last_pt(tmp_path, data_dir, monkeypatch, caplog):
    """Step 3's loss and a gradient are NaN (the weights hold NaN from its update on); Ctrl-C comes in
    step 4, before any record (train.log_every=10) could stop the run. The interrupt stops it, but
    last.pt stays step 2's (train.save_every=2), with finite weights, and the log says why. Before,
    the interrupt saved the NaN weights as last.pt, and the printed --resume continued them."""
    backward, train_step = Trainer.backward, Trainer.train_step

    def diverging(self, group, n_tokens):
        total = backward(self, group, n_tokens)
        if self.step + 1 >= 3:
            next(self.model.parameters()).grad.view(-1)[0] = float("nan")
            return total * float("nan")
        return total

    def interrupted_fourth(self, group):
        out = train_step(self, group)
        if self.step == 3:  # inside step 4 (self.step counts it after train_step)
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(Trainer, "backward", diverging)
    monkeypatch.setattr(Trainer, "train_step", interrupted_fourth)
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.log_every=10", "train.save_every=2", "train.accum_steps=1",
                         "train.num_threads=1")
    with caplog.at_level(logging.ERROR, logger="cometnmt.training.trainer"), pytest.raises(KeyboardInterrupt):
        run_module.train(cfg)
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == 2 and all(t.isfinite().all() for t in last["model"].values() if t.is_floating_point())
    assert "the model's weights are no longer finite" in caplog.text and "not writing last.pt on the interrupt" in caplog.text
    assert f"{tmp_path / 'last.pt'} (step 2) is the last checkpoint, kept as it was" in caplog.text
