"""The numbers training reports: the metrics log's learning rate, loss and token counts mean what
docs/training.md says."""

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


def test_a_step_the_fp16_loss_scaler_skips_does_not_advance_the_schedule(tmp_path, data_dir, monkeypatch):
    """train.precision=fp16 (GradScaler on the CPU too): step 2's gradients overflow (an inf
    written into one), so the scaler skips it and halves its scale. Steps 3-5 then take the rates
    of updates 2-4: 1e-3 * lr_factor(1, 2, 3). Before, the schedule moved on at the skipped step as
    well, and they took lr_factor(2, 3, 4); the checkpoint's schedule counted 5 updates for 4."""
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    backward = Trainer.backward

    def overflowing_second(self, group, n_tokens):
        total = backward(self, group, n_tokens)
        if self.step == 1:
            next(self.model.parameters()).grad.view(-1)[0] = float("inf")
        return total

    monkeypatch.setattr(Trainer, "backward", overflowing_second)
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.precision=fp16", "train.schedule=inverse_sqrt",
                         "train.warmup_steps=4", "train.lr=1e-3", "train.log_every=1", "train.accum_steps=1",
                         "train.max_steps=5", "train.num_threads=1")
    run_module.train(cfg)
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["lr"] for r in records] == pytest.approx([1e-3 * lr_factor(k, "inverse_sqrt", 4) for k in (0, 1, 1, 2, 3)])
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["scaler"]["scale"] == 2.0**15 and last["scheduler"]["last_epoch"] == 4 and last["step"] == 5


def test_a_run_max_steps_ends_inside_a_log_window_logs_that_window(tmp_path, data_dir):
    """train.max_steps=3 with train.log_every=10: the record of steps 1-3 is logged at step 3.
    Before, the run ended with no metrics.jsonl at all."""
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=3", "train.log_every=10"))
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [3] and records[0]["loss"] > 0


def test_a_run_max_steps_ends_inside_an_epoch_is_validated_there(tmp_path, data_dir):
    """train.max_steps=3 inside epoch 1: the run validates at step 3 (a ``valid_mid_epoch`` record,
    outside the epochs' history) and keeps best.pt. Before, it had neither a validation nor a
    best.pt. A resume at the same step validates nothing again; one past it goes on to the epoch's
    own validation, and best.pt is the better of the two."""
    from cometnmt.training.checkpoint import load_checkpoint

    cfg = tiny_train_cfg(tmp_path, data_dir, "train.max_steps=3", "train.num_threads=1")
    summary = run_module.train(cfg)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    (mid,) = [r for r in records if r["event"].startswith("valid")]
    assert (mid["event"], mid["epoch"], mid["step"]) == ("valid_mid_epoch", 1, 3)
    assert summary["best"] == mid["val_loss"] and summary["history"] == [] and summary["epochs"] == 0
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 3 and load_checkpoint(tmp_path / "last.pt")["step"] == 3
    run_module.train(cfg, resume=True)  # nothing to train and nothing to validate again
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()] == records
    summary = run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=null", "train.num_threads=1"), resume=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["event"] for r in records if r["event"].startswith("valid")] == ["valid_mid_epoch", "valid"]
    epoch_end = records[-1]
    assert summary["epochs"] == 1 and summary["best"] == min(mid["val_loss"], epoch_end["val_loss"])
    assert load_checkpoint(tmp_path / "best.pt")["step"] == (3 if mid["val_loss"] <= epoch_end["val_loss"] else epoch_end["step"])


def test_max_steps_at_an_epochs_end_validates_once(tmp_path, data_dir, monkeypatch):
    """train.max_steps=5 is epoch 1's last step (5 steps an epoch) and max_epochs=2: the epoch's
    validation is the run's only one. Before, epoch 2 began, found max_steps reached and validated
    the same model again, logged as a ``valid_mid_epoch`` of epoch 2 (of which nothing was trained)."""
    from cometnmt.training.trainer import Trainer

    validate, calls = Trainer.validate, []
    monkeypatch.setattr(Trainer, "validate", lambda self: calls.append(self.step) or validate(self))
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.max_steps=5", "train.max_epochs=2"))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["event"], r["epoch"], r["step"]) for r in records if r["event"] != "train"] == [("valid", 1, 5)]
    assert calls == [5]


def test_a_resume_under_another_stopping_metric_rescores_the_best(tmp_path, data_dir, monkeypatch):
    """A run saved with a loss rule (best = lowest validation loss, 2.0) resumed with
    ``train.stopping=bleu_patience``: epoch 2's BLEU 20 is below epoch 1's 30, so best.pt stays
    epoch 1's. Before, the saved best 2.0 (a loss) was compared with BLEU 20, epoch 2 counted as
    better and overwrote best.pt, and the run's best became 20."""
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    scores = iter([{"val_loss": 2.0, "val_loss_per_100_tokens": 200.0, "val_bleu": 30.0},
                   {"val_loss": 3.0, "val_loss_per_100_tokens": 300.0, "val_bleu": 20.0}])
    monkeypatch.setattr(Trainer, "validate", lambda self: next(scores))
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.stopping=none", "train.valid_bleu=true"))
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.stopping=bleu_patience", "train.valid_bleu=true",
                         "train.max_epochs=2")
    run_module.train(cfg, resume=True)
    last, best = load_checkpoint(tmp_path / "last.pt"), load_checkpoint(tmp_path / "best.pt")
    assert last["epoch"] == 2 and last["trainer"]["best"] == 30.0 and last["trainer"]["stale"] == 1
    assert best["epoch"] == 1


def test_a_run_its_stopping_rule_ended_resumes_under_another_rule(tmp_path, data_dir, monkeypatch):
    """Validation losses 2, 3, 4: train.stopping=loss_rise (2 epochs) ends the run after epoch 3
    of 5. Resumed with the same rule it stays finished; with ``train.stopping=none`` or
    ``loss_rise_epochs=3`` it trains on to max_epochs. Before, ``finished`` stayed as the old
    rule had set it and the resume trained nothing ("already finished ... its stopping rule")."""
    import shutil

    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    def validate(self):
        loss = 2.0 + len(self.history)
        return {"val_loss": loss, "val_loss_per_100_tokens": 100 * loss}

    monkeypatch.setattr(Trainer, "validate", validate)
    first = tiny_train_cfg(tmp_path / "run", data_dir, "train.stopping=loss_rise", "train.loss_rise_epochs=2",
                           "train.max_epochs=5")
    assert run_module.train(first)["epochs"] == 3
    for name in ("same", "none", "three"):
        shutil.copytree(tmp_path / "run", tmp_path / name)
    assert run_module.train(tiny_train_cfg(tmp_path / "same", data_dir, "train.stopping=loss_rise",
                                           "train.loss_rise_epochs=2", "train.max_epochs=5"), resume=True)["epochs"] == 3
    assert run_module.train(tiny_train_cfg(tmp_path / "none", data_dir, "train.stopping=none", "train.max_epochs=4"),
                            resume=True)["epochs"] == 4
    three = tiny_train_cfg(tmp_path / "three", data_dir, "train.stopping=loss_rise", "train.loss_rise_epochs=3",
                           "train.max_epochs=5")
    assert run_module.train(three, resume=True)["epochs"] == 4  # epoch 4's rise is the third
    assert load_checkpoint(tmp_path / "three" / "last.pt")["trainer"]["finished"]
    assert load_checkpoint(tmp_path / "none" / "best.pt")["epoch"] == 1


def test_loss_rise_counts_a_validation_loss_that_is_not_a_number_as_a_rise(tmp_path, data_dir, monkeypatch):
    """Validation losses 2, NaN, NaN (a diverged model: weights that hold NaN stay NaN) under
    loss_rise (2 epochs): the run stops after epoch 3 of 6, and best.pt stays epoch 1's. Before,
    ``NaN > 2`` is False, so no NaN epoch counted as a rise, the count started again at 0 and the
    run trained its NaN weights to max_epochs. A finite loss after a NaN one is no rise (it is better)."""
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    def run(losses, name):
        scores = iter([{"val_loss": x, "val_loss_per_100_tokens": 100 * x} for x in losses])
        monkeypatch.setattr(Trainer, "validate", lambda self: next(scores))
        cfg = tiny_train_cfg(tmp_path / name, data_dir, "train.stopping=loss_rise", "train.loss_rise_epochs=2",
                             "train.max_epochs=6", "data.max_train_pairs=30")
        return run_module.train(cfg)["epochs"], load_checkpoint(tmp_path / name / "best.pt")["epoch"]

    nan = float("nan")
    assert run([2.0, nan, nan, nan, nan, nan], "diverged") == (3, 1)
    assert run([2.0, nan, 1.5, nan, 1.0, 0.5], "recovered") == (6, 6)


def test_a_finite_validation_loss_beats_a_best_that_is_not_a_number(tmp_path, data_dir, monkeypatch):
    """Validation losses NaN, 2, 1.5 (epoch 1's NaN: an fp16 validation that overflowed, say): epoch 3
    is the best and best.pt. Before, the NaN became the best and ``2 < NaN`` is False, so no later
    epoch ever improved on it: best.pt stayed epoch 1's NaN model for the whole run."""
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    scores = iter([{"val_loss": x, "val_loss_per_100_tokens": 100 * x} for x in (float("nan"), 2.0, 1.5)])
    monkeypatch.setattr(Trainer, "validate", lambda self: next(scores))
    summary = run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.stopping=none", "train.max_epochs=3",
                                              "data.max_train_pairs=30"))
    assert summary["best"] == 1.5 and load_checkpoint(tmp_path / "best.pt")["epoch"] == 3


def test_a_resume_under_another_stopping_rule_keeps_a_better_mid_epoch_best(tmp_path, data_dir, monkeypatch):
    """train.max_steps=3 stops epoch 1 inside it; its validation there (loss 2.0) is the best and
    best.pt. Resumed to the epoch's end (loss 3.0) with loss_rise_epochs=3 (the same measure, the
    loss), the replay of the stopping rule counts the mid-epoch best: best.pt stays step 3's and
    the best 2.0. Before, the replay knew the epochs' records only, found no best, and the worse
    epoch-end model overwrote best.pt (step 5, best 3.0)."""
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    scores = iter([{"val_loss": 2.0, "val_loss_per_100_tokens": 200.0}, {"val_loss": 3.0, "val_loss_per_100_tokens": 300.0}])
    monkeypatch.setattr(Trainer, "validate", lambda self: next(scores))
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.stopping=loss_rise", "train.max_steps=3"))
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 3
    summary = run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.stopping=loss_rise", "train.loss_rise_epochs=3"),
                               resume=True)
    assert summary["epochs"] == 1 and summary["best"] == 2.0
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 3 and load_checkpoint(tmp_path / "last.pt")["step"] == 5


def test_accumulated_micro_batches_give_the_gradient_of_one_batch_of_them(tmp_path, data_dir):
    """The objective is the step's summed loss over its target tokens (label smoothing on), so two
    micro-batches accumulated give the gradient of one batch holding both (no dropout)."""
    import torch

    from cometnmt.data.pipeline import encode_pairs, read_split
    from cometnmt.models import build_model
    from cometnmt.training.trainer import Trainer

    cfg = tiny_train_cfg(tmp_path, data_dir, "model.dropout=0", "train.label_smoothing=0.1", "data.max_train_pairs=40")
    codec, train = run_module.training_examples(cfg, read_split(cfg.data, "train"))
    valid = encode_pairs(codec, read_split(cfg.data, "valid"), None)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), 0)
    trainer = Trainer(cfg, model, codec, train, valid, torch.device("cpu"))
    a, b = list(range(0, 7)), list(range(7, 19))
    n_tokens = sum(len(train.tgt_ids[i]) + 1 for i in a + b)

    def gradients(group):
        model.zero_grad(set_to_none=True)
        trainer.backward(group, n_tokens)
        return [p.grad.clone() for p in model.parameters()]

    for split, whole in zip(gradients([a, b]), gradients([a + b])):
        torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-6)


def test_accumulated_tag_losses_give_the_gradient_of_one_batch_of_them(tmp_path, data_dir):
    """Transformer++'s tag losses are means over labelled source tokens; accumulated over a step's
    micro-batches they are the step's mean over its labelled tokens too, so two micro-batches give
    the gradient (and the logged loss_pos) of one batch holding both. Before, each micro-batch's
    mean was weighed by its share of the step's target tokens: a micro-batch with few labelled
    tokens weighed as much as one fully labelled (on Multi30k with the presets' 8 micro-batches of
    1,024 tokens, a micro-batch's weight was up to 50% off its share of the labelled tokens)."""
    import torch

    from cometnmt.data.pipeline import build_codec, encode_pairs, read_split
    from cometnmt.models import build_model
    from cometnmt.models.transformer_pp import IGNORE
    from cometnmt.training.trainer import Trainer

    cfg = tiny_train_cfg(tmp_path, data_dir, "model.arch=transformer_pp", "model.dropout=0", "model.enc_layers=2",
                         "model.transformer_pp.tasks=[pos]", "model.transformer_pp.weight_dropout=0",
                         "model.transformer_pp.embed_dropout=0", "model.transformer_pp.pos_weight=0.5",
                         "data.max_train_pairs=40")
    corpus = read_split(cfg.data, "train")
    codec, src_tokens, tgt_tokens = build_codec(cfg.data, corpus)
    train = encode_pairs(codec, corpus, None, (src_tokens, tgt_tokens))
    gen = torch.Generator().manual_seed(0)
    a, b = list(range(0, 7)), list(range(7, 19))
    # gold tags without a tagger: micro-batch a has a few labelled tokens, b has all of its own
    train.src_tags = {"pos": [[int(torch.randint(0, 17, (1,), generator=gen)) if i in b or j == 0 else IGNORE
                               for j in range(len(row))] for i, row in enumerate(train.src_ids)]}
    valid = encode_pairs(codec, read_split(cfg.data, "valid"), None)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), 0)
    trainer = Trainer(cfg, model, codec, train, valid, torch.device("cpu"))
    n_tokens = sum(len(train.tgt_ids[i]) + 1 for i in a + b)

    def gradients(group):
        model.zero_grad(set_to_none=True)
        trainer.backward(group, n_tokens)
        return [p.grad.clone() for p in model.parameters()], float(trainer.step_extra["pos"]) / trainer.step_extra_tokens["pos"]

    (split, logged_split), (whole, logged_whole) = gradients([a, b]), gradients([a + b])
    for x, y in zip(split, whole):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    assert logged_split == pytest.approx(logged_whole, rel=1e-5)


def test_keep_checkpoints_keeps_the_last_n_after_a_resume_with_a_smaller_n(tmp_path, data_dir):
    """train.keep_checkpoints=2 for two epochs, then a resume with 1 for a third: only epoch003.pt
    is left. Before, each epoch removed only the file N epochs back, and epoch001.pt stayed."""
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.keep_checkpoints=2", "train.max_epochs=2"))
    assert sorted(p.name for p in tmp_path.glob("epoch*.pt")) == ["epoch001.pt", "epoch002.pt"]
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.keep_checkpoints=1", "train.max_epochs=3"), resume=True)
    assert sorted(p.name for p in tmp_path.glob("epoch*.pt")) == ["epoch003.pt"]


def test_a_resume_from_an_older_epoch_checkpoint_keeps_the_epochs_it_writes(tmp_path, data_dir, monkeypatch):
    """Three epochs kept, then epoch001.pt copied over last.pt (as --resume advises where last.pt is
    lost) and resumed with keep_checkpoints=1: epoch 2's checkpoint was deleted the moment it was
    written, as the older run's epoch003.pt counted as the newest. Now the epochs up to the one
    written are counted; epoch003.pt is written anew when the run reaches it."""
    import shutil

    from cometnmt.training.trainer import Trainer

    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.keep_checkpoints=3", "train.max_epochs=3"))
    shutil.copy(tmp_path / "epoch001.pt", tmp_path / "last.pt")
    seen = []
    end_epoch = Trainer.end_epoch

    def listed(self):
        end_epoch(self)
        seen.append(sorted(p.name for p in tmp_path.glob("epoch*.pt")))

    monkeypatch.setattr(Trainer, "end_epoch", listed)
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "train.keep_checkpoints=1", "train.max_epochs=3"), resume=True)
    assert seen == [["epoch002.pt", "epoch003.pt"], ["epoch003.pt"]]


def test_a_save_every_checkpoint_write_is_not_counted_as_training_time(tmp_path, data_dir, monkeypatch):
    """With a clock that moves 1 s per reading and 1,000 s while ``last.pt`` is written, every
    window's tokens/s is its tokens over a few seconds. Before, the write of step s's save_every
    checkpoint landed in the window of step s + 1, whose tokens/s then read a thousand times low."""
    import types

    from cometnmt.training import trainer as trainer_module

    clock = [0.0]

    def perf_counter():
        clock[0] += 1.0
        return clock[0]

    save = trainer_module.Trainer.save

    def slow_save(self, name):
        save(self, name)
        clock[0] += 1000.0

    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(trainer_module.Trainer, "save", slow_save)
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.log_every=1", "train.save_every=1", "train.accum_steps=1",
                         "train.max_steps=4")
    run_module.train(cfg)
    records = train_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # the log has no token counts, so compare the windows: the first holds no write, and with the
    # write left out the others are as fast within the spread of their batches' sizes
    rates = [r["tgt_tokens_per_s"] for r in records]
    assert min(rates) > 0 and max(rates) / min(rates) < 100, rates


def test_the_validation_log_says_when_the_paper_metric_was_lowercased(tmp_path, data_dir, caplog):
    """A model trained with data.lowercase is validated on lowercased references; train.log's epoch
    line said only "COMET paper metric", as for a cased model (evaluate's table said "lowercased")."""
    import logging

    from cometnmt.evaluation import paper_label

    caplog.set_level(logging.INFO, logger="cometnmt")
    run_module.train(tiny_train_cfg(tmp_path, data_dir, "data.lowercase=true", "train.valid_bleu=true",
                                    "train.valid_bleu_max_sentences=10"))
    assert f"{paper_label(True)} " in (tmp_path / "train.log").read_text(encoding="utf-8")
    assert paper_label(True) != paper_label(False)


def test_a_resume_under_another_measure_makes_best_pt_the_new_best(tmp_path, data_dir, monkeypatch, caplog):
    """Epochs 1-2 under train.stopping=none (the loss: best.pt is epoch 1, loss 2.0, BLEU 20),
    resumed with bleu_patience to epoch 3 (BLEU 25): the replayed best is epoch 2 (BLEU 30). Before,
    best.pt stayed epoch 1's, the lowest loss, decoded as the "best-validation-BLEU checkpoint".
    With epoch 2's checkpoint kept (keep_checkpoints) best.pt is now that; without it best.pt cannot
    be made, and the log, last.pt (best_behind) and the reports say so until a validation beats it."""
    import logging

    from cometnmt.experiments import best_behind_lines, how_it_ended
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.trainer import Trainer

    def scored(loss, bleu):
        return {"val_loss": loss, "val_loss_per_100_tokens": 100 * loss, "val_bleu": bleu}

    for keep in (2, 0):
        run = tmp_path / f"keep{keep}"
        scores = iter([scored(2.0, 20.0), scored(3.0, 30.0), scored(4.0, 25.0), scored(5.0, 35.0)])
        monkeypatch.setattr(Trainer, "validate", lambda self: next(scores))
        run_module.train(tiny_train_cfg(run, data_dir, "train.stopping=none", "train.valid_bleu=true", "train.max_epochs=2",
                                        f"train.keep_checkpoints={keep}"))
        assert load_checkpoint(run / "best.pt")["epoch"] == 1
        if keep:  # a resume that trains nothing (max_epochs reached) leaves the run, best.pt included, as it was
            run_module.train(tiny_train_cfg(run, data_dir, "train.stopping=bleu_patience", "train.valid_bleu=true",
                                            "train.max_epochs=2", f"train.keep_checkpoints={keep}"), resume=True)
            assert load_checkpoint(run / "best.pt")["epoch"] == 1
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="cometnmt"):
            summary = run_module.train(tiny_train_cfg(run, data_dir, "train.stopping=bleu_patience", "train.valid_bleu=true", "train.max_epochs=3",
                                                      f"train.keep_checkpoints={keep}"), resume=True)
        assert summary["best"] == 30.0 and summary["epochs"] == 3
        best, last = load_checkpoint(run / "best.pt"), load_checkpoint(run / "last.pt")
        if keep:
            assert best["epoch"] == 2 and "best.pt is now epoch002.pt (epoch 2, step" in caplog.text
            assert last["trainer"]["best_behind"] is None and "best_behind" not in how_it_ended(run)
            continue
        assert best["epoch"] == 1  # epoch 2's weights are gone: said, not hidden
        assert "under train.stopping=bleu_patience the best validation is val_bleu 30 at step" in caplog.text
        behind = how_it_ended(run)["best_behind"]
        assert (behind["held_step"], behind["best_epoch"], behind["value"]) == (best["step"], 2, 30.0)
        line = best_behind_lines([{"row": "comet", "seed": 1, "best_behind": behind}], lambda r: r["row"])[-1]
        assert line.startswith("- **best.pt is not the best validation under the run's stopping rule**")
        assert f"comet seed 1 (best.pt: step {best['step']}; best under train.stopping=bleu_patience: epoch 2" in line
        assert best_behind_lines([{"row": "a", "seed": 1, "best_behind": behind, "checkpoint": ["epoch001.pt"]}], str) == []
        run_module.train(tiny_train_cfg(run, data_dir, "train.stopping=bleu_patience", "train.valid_bleu=true",
                                        "train.max_epochs=4"), resume=True)
        assert load_checkpoint(run / "best.pt")["epoch"] == 4  # BLEU 35 beats 30: best.pt is the best again
        assert "best_behind" not in how_it_ended(run)


def _fused_and_logits(tmp_path, data_dir, arch: str, *overrides: str):
    """A tiny ``arch`` Trainer on the CPU with label smoothing, and its loss and gradients over two
    micro-batches through the fused loss and through the logits (the same dropout masks: each
    micro-batch is seeded): (cfg, trainer, (fused loss, grads), (logits loss, grads)), the grads by
    parameter name."""
    import torch

    from cometnmt.data.pipeline import encode_pairs, read_split
    from cometnmt.models import build_model
    from cometnmt.training.trainer import Trainer

    tags = ["model.transformer_pp.tasks=[]"] if arch == "transformer_pp" else []
    cfg = tiny_train_cfg(tmp_path, data_dir, f"model.arch={arch}", "train.label_smoothing=0.1",
                         "data.max_train_pairs=40", *tags, *overrides)
    codec, train = run_module.training_examples(cfg, read_split(cfg.data, "train"))
    valid = encode_pairs(codec, read_split(cfg.data, "valid"), None)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), 0)
    trainer = Trainer(cfg, model, codec, train, valid, torch.device("cpu"))
    assert trainer.fused_loss
    a, b = list(range(0, 7)), list(range(7, 19))
    n_tokens = sum(len(train.tgt_ids[i]) + 1 for i in a + b)

    def loss_and_gradients(fused):
        trainer.fused_loss = fused
        model.zero_grad(set_to_none=True)
        loss = trainer.backward([a, b], n_tokens)
        return loss, {name: p.grad.clone() for name, p in model.named_parameters()}

    return cfg, trainer, loss_and_gradients(True), loss_and_gradients(False)


@pytest.mark.parametrize("arch", ["transformer", "comet", "convs2s", "rnn", "transformer_pp"])
def test_the_cpu_fused_loss_gives_the_gradients_of_logits_and_token_loss(tmp_path, data_dir, arch):
    """On the CPU in float32 the trainer takes the decoder's features and the output layer's
    weights into one loss (loss.linear_cross_entropy) instead of the B,T,V logits: the same loss
    and gradients as the logits path, dropout and label smoothing on (the same masks: each
    micro-batch is seeded), for every built-in architecture. A model whose own ``decode`` replaces
    the base class's keeps the logits path."""
    import torch

    from cometnmt.training.trainer import Trainer

    cfg, trainer, (fused_loss, fused), (plain_loss, plain) = _fused_and_logits(tmp_path, data_dir, arch)
    torch.testing.assert_close(fused_loss, plain_loss)
    for name in plain:
        torch.testing.assert_close(fused[name], plain[name], rtol=1e-4, atol=1e-6)
    model = trainer.model

    class OwnDecode(type(model)):  # a plugin's decode: its logits are its own business
        def decode(self, tgt_in, memory):
            return super().decode(tgt_in, memory)

    model.__class__ = OwnDecode
    assert not Trainer(cfg, model, trainer.codec, trainer.train_data, trainer.valid_data, torch.device("cpu")).fused_loss


@pytest.mark.parametrize("arch", ["transformer", "comet"])
def test_the_cpu_fused_loss_in_bf16_gives_the_logits_paths_numbers_to_bf16_rounding(tmp_path, data_dir, arch):
    """Under train.precision bf16 on the CPU the trainer fuses the output layer and the loss too, its
    products in bf16 (loss.linear_cross_entropy's ``low``): the loss of the logits path (autocast's
    bf16 logits, a float32 cross-entropy) and its gradients to bf16's rounding, each parameter's
    within 5% (L2), but the attention key biases': theirs is zero but for rounding (a shift shared
    by all keys leaves the softmax as it is), so two roundings differ wholly. fp16 keeps the logits."""
    import torch

    from cometnmt.training.trainer import Trainer

    cfg, trainer, (fused_loss, fused), (plain_loss, plain) = _fused_and_logits(tmp_path, data_dir, arch,
                                                                                "train.precision=bf16")
    assert trainer.fused_low is torch.bfloat16
    torch.testing.assert_close(fused_loss, plain_loss, rtol=1e-5, atol=0)
    off = {name: float((fused[name] - g).norm() / g.norm()) for name, g in plain.items() if not name.endswith("k_proj.bias")}
    assert len(off) > 20 and max(off.values()) < 0.05, sorted(off.items(), key=lambda kv: -kv[1])[:3]
    cfg.train.precision = "fp16"
    assert not Trainer(cfg, trainer.model, trainer.codec, trainer.train_data, trainer.valid_data, torch.device("cpu")).fused_loss


def _nan_from_step(first: int, *, fp16: bool = False):
    """A Trainer.backward whose steps from ``first`` on have a loss that is not a number: NaN returned
    as the loss and written into a gradient, as a diverged model's are (under fp16 the loss scaler then
    skips the step; else the optimizer applies it and the weights hold NaN)."""
    from cometnmt.training.trainer import Trainer

    backward = Trainer.backward

    def diverging(self, group, n_tokens):
        total = backward(self, group, n_tokens)
        if self.step + 1 >= first:
            next(self.model.parameters()).grad.view(-1)[0] = float("nan")
            return total * float("nan")
        return total

    return diverging


def _strict_json(line: str) -> dict:
    """json.loads as jq or JavaScript's JSON.parse read: NaN and Infinity are not JSON."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_a_training_loss_that_is_not_a_number_stops_the_run_at_its_record(tmp_path, data_dir, monkeypatch):
    """train.stopping=none, a record a step, last.pt every 2 steps; step 3's loss is NaN (a diverged
    model). The run stops at step 3's record with TrainingDiverged (a FloatingPointError) naming the
    step and the loss; the record is logged, in valid JSON (null, named under ``nonfinite``); last.pt
    stays step 2's, whose weights are finite, and no best.pt is written. Before, nothing looked at the
    training loss: the run trained its NaN weights to the epoch's end and saved them as last.pt and
    best.pt."""
    from cometnmt.errors import TrainingDiverged
    from cometnmt.training.checkpoint import LAST_CHECKPOINT, load_checkpoint
    from cometnmt.training.run_files import read_metrics
    from cometnmt.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "backward", _nan_from_step(3))
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.stopping=none", "train.log_every=1", "train.save_every=2",
                         "train.accum_steps=1", "train.num_threads=1")
    with pytest.raises(TrainingDiverged) as caught:
        run_module.train(cfg)
    message = str(caught.value)
    assert isinstance(caught.value, FloatingPointError)
    assert "training stopped at step 3 (epoch 1): the training loss is not a number (loss nan; first at step 3" in message
    assert f"{tmp_path / LAST_CHECKPOINT} (step 2) is the last checkpoint, kept as it was" in message
    last = load_checkpoint(tmp_path / LAST_CHECKPOINT)
    assert last["step"] == 2 and all(t.isfinite().all() for t in last["model"].values() if t.is_floating_point())
    assert not (tmp_path / "best.pt").exists()
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [_strict_json(line)["step"] for line in lines] == [1, 2, 3]
    assert _strict_json(lines[-1])["loss"] is None and _strict_json(lines[-1])["nonfinite"] == {"loss": "NaN"}
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["loss"] != records[-1]["loss"] and "nonfinite" not in records[-1]  # NaN again


def test_a_checkpoint_of_weights_that_are_not_finite_is_not_written(tmp_path, data_dir, monkeypatch):
    """As above, but a record every 10 steps: step 4's last.pt (train.save_every=2) comes before the
    record that would stop the run. The weights hold NaN since step 3's update, so the run stops there
    writing nothing: last.pt stays step 2's. Before, last.pt was written with NaN weights, and a
    --resume continued a diverged model."""
    from cometnmt.errors import TrainingDiverged
    from cometnmt.training.checkpoint import LAST_CHECKPOINT, load_checkpoint
    from cometnmt.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "backward", _nan_from_step(3))
    cfg = tiny_train_cfg(tmp_path, data_dir, "train.stopping=none", "train.log_every=10", "train.save_every=2",
                         "train.accum_steps=1", "train.num_threads=1")
    with pytest.raises(TrainingDiverged, match=r"training stopped at step 4 \(epoch 1\): the model's weights are no "
                                               r"longer finite \(.* holds NaN or an infinity\); the training loss was "
                                               r"first not a number at step 3: the model diverged; not writing last.pt"):
        run_module.train(cfg)
    assert load_checkpoint(tmp_path / LAST_CHECKPOINT)["step"] == 2
    assert not (tmp_path / "metrics.jsonl").exists()  # no record was due (log_every=10)


def test_under_fp16_a_skipped_step_whose_loss_is_not_a_number_does_not_stop_the_run(tmp_path, data_dir, monkeypatch,
                                                                                    caplog):
    """train.precision=fp16: step 2's loss is NaN (and a gradient: an overflow). The loss scaler skips
    the step and halves its scale, the weights are unharmed, and the run goes on to max_steps with
    a warning; the record of step 2 holds the NaN (valid JSON). With every step overflowing, the run
    stops once the scale falls below MIN_LOSS_SCALE (here 2**14, reached after 3 skipped steps)."""
    import logging

    from cometnmt.errors import TrainingDiverged
    from cometnmt.training import trainer as trainer_module
    from cometnmt.training.checkpoint import load_checkpoint
    from cometnmt.training.run_files import read_metrics
    from cometnmt.training.trainer import Trainer

    backward = Trainer.backward
    once = _nan_from_step(2)
    monkeypatch.setattr(Trainer, "backward", lambda self, g, n: (once if self.step == 1 else backward)(self, g, n))
    cfg = tiny_train_cfg(tmp_path / "once", data_dir, "train.precision=fp16", "train.log_every=1", "train.max_steps=4",
                         "train.accum_steps=1", "train.num_threads=1")
    with caplog.at_level(logging.WARNING, logger="cometnmt.training.trainer"):
        run_module.train(cfg)
    assert "step 2: the training loss is not a number (loss nan; first at step 2" in caplog.text
    losses = [r["loss"] for r in read_metrics(tmp_path / "once" / "metrics.jsonl") if r["event"] == "train"]
    assert [loss != loss for loss in losses] == [False, True, False, False]
    last = load_checkpoint(tmp_path / "once" / "last.pt")
    assert last["step"] == 4 and last["scaler"]["scale"] == 2.0**15
    assert all(t.isfinite().all() for t in last["model"].values() if t.is_floating_point())

    monkeypatch.setattr(Trainer, "backward", _nan_from_step(1))
    monkeypatch.setattr(trainer_module, "MIN_LOSS_SCALE", 2.0**14)
    cfg = tiny_train_cfg(tmp_path / "always", data_dir, "train.precision=fp16", "train.log_every=1",
                         "train.max_steps=10", "train.accum_steps=1", "train.num_threads=1")
    with pytest.raises(TrainingDiverged, match=r"training stopped at step 3 \(epoch 1\): the fp16 loss scale fell to "
                                               r"8192, below 16384.*no checkpoint had been written"):
        run_module.train(cfg)


def test_the_metrics_log_is_valid_json_and_reads_back_old_and_new_lines():
    """metrics_line writes a number that is not finite as null and names it under ``nonfinite``;
    read_metrics_record gives back the floats, from such a line and from an old one with bare NaN."""
    from cometnmt.training.run_files import metrics_line, read_metrics_record

    inf = float("inf")
    line = metrics_line({"event": "valid", "step": 3, "val_loss": float("nan"), "val_loss_per_100_tokens": inf,
                         "val_bleu": -inf, "val_chrf": 40.5})
    assert _strict_json(line) == {"event": "valid", "step": 3, "val_loss": None, "val_loss_per_100_tokens": None,
                                  "val_bleu": None, "val_chrf": 40.5,
                                  "nonfinite": {"val_loss": "NaN", "val_loss_per_100_tokens": "Infinity",
                                                "val_bleu": "-Infinity"}}
    for text in (line, '{"event": "valid", "step": 3, "val_loss": NaN, "val_loss_per_100_tokens": Infinity, '
                       '"val_bleu": -Infinity, "val_chrf": 40.5}'):
        record = read_metrics_record(text)
        assert record["val_loss"] != record["val_loss"] and record["val_loss_per_100_tokens"] == inf
        assert record["val_bleu"] == -inf and record["val_chrf"] == 40.5 and "nonfinite" not in record
    assert metrics_line({"event": "train", "loss": 2.5}) == '{"event": "train", "loss": 2.5}'  # finite: as before


def test_cometnmt_train_says_in_one_line_that_the_run_diverged(tmp_path, data_dir, cli, monkeypatch):
    """`cometnmt train` of a run whose loss is NaN from step 2 on (a plugin module patches the
    trainer in the CLI's process): one line naming the step, exit 2 (a message complete on its own,
    not a traceback), and train.log says why the run stopped."""
    plugin = tmp_path / "diverge.py"
    plugin.write_text(
        "from cometnmt.training.trainer import Trainer\n"
        "backward = Trainer.backward\n"
        "def diverging(self, group, n_tokens):\n"
        "    total = backward(self, group, n_tokens)\n"
        "    if self.step + 1 >= 2:\n"
        "        next(self.model.parameters()).grad.view(-1)[0] = float('nan')\n"
        "        return total * float('nan')\n"
        "    return total\n"
        "Trainer.backward = diverging\n", encoding="utf-8")
    monkeypatch.setenv("COMETNMT_PLUGINS", str(plugin))
    run = tmp_path / "run"
    sets = [f"data.multi30k_dir={data_dir}", "data.max_train_pairs=300", "data.max_valid_pairs=20",
            "train.batch_tokens=600", "train.valid_bleu=false", "train.progress=false", "train.log_every=1",
            "train.num_threads=1", f"train.save_dir={run}"]
    proc = cli("train", "configs/tiny.yaml", *(a for s in sets for a in ("--set", s)), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert ("cometnmt: error: training stopped at step 2 (epoch 1): the training loss is not a number (loss nan; "
            "first at step 2, 1 of the log window's steps)") in proc.stderr
    assert "no checkpoint had been written" in proc.stderr and not (run / "last.pt").exists()
    assert "the run stopped: training stopped at step 2" in (run / "train.log").read_text(encoding="utf-8")
