"""The training loop. It knows the model only through ``model(src, src_pad_mask, tgt_in) -> logits``
and ``model.extra_losses()``.

Position and determinism: the batches of epoch e are a pure function of (train.seed, e), an
optimizer step consumes ``accum_steps * world_size`` consecutive micro-batches of that list (the
epoch's last step what is left, so no data is dropped and ranks train as one process with
``accum_steps * world_size`` does), and a checkpoint records the epoch, the number of micro-batches
consumed and the RNG state as it was at the start of the next step. Each micro-batch draws its
random numbers (dropout, DropConnect) from a generator seeded by (train.seed, epoch, its index in
the epoch), so a micro-batch gets the same masks whichever rank trains it: two ranks with dropout
train as one process that accumulates their micro-batches does. Resuming therefore continues
exactly where the run stopped, also with a different number of ranks (the rest of the epoch's
micro-batches is re-split among the new ranks; a rank a step leaves without one joins the
gradient all-reduce with a zero-weighted micro-batch). Batch-norm running statistics follow every
rank's micro-batches in that order too (``distributed.SyncedRunningStatistics``).

Stopping (section 4.2 of the COMET paper): ``loss_rise`` stops once the validation loss has risen
``loss_rise_epochs`` epochs in a row and keeps the lowest-loss checkpoint as ``best.pt``;
``bleu_patience`` keeps the highest validation BLEU and stops after ``patience`` epochs without a
better one.

Divergence, under every stopping rule (``none`` too): a training record whose loss is not a number
(NaN, an infinity) stops the run with :class:`TrainingDiverged`, as fairseq stops with "loss is
NaN", and no checkpoint is written of weights that are not finite, so the last one saved stays the
last good one. Under fp16 the loss scaler skips such steps (the weights are unharmed) and the run
goes on; it stops once the loss scale falls below ``MIN_LOSS_SCALE``. See :meth:`Trainer._diverged`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import math
import random
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from cometnmt.atomic import atomic_write, make_folder
from cometnmt.config import CUDA_GRAPH_MODES, Config, to_dict
from cometnmt.data.batching import Batch, collate, make_batches
from cometnmt.data.pipeline import Examples, TextCodec
from cometnmt.data.tagging import labelled_counts, select_tags
from cometnmt.data.tokenizers import paper_tokenizer
from cometnmt.data.vocab import PAD
from cometnmt.decoding import precision_context
from cometnmt.errors import TrainingDiverged
from cometnmt.evaluation import corpus_scores, paper_bleu, paper_label
from cometnmt.inference import Translator
from cometnmt.interrupts import HandOver, deferred, first_raises, ignored, raise_noted
from cometnmt.models.base import Seq2Seq
from cometnmt.modules.output import VocabProjection
from cometnmt.progress import progress_bar
from cometnmt.training.checkpoint import (BEST_CHECKPOINT, LAST_CHECKPOINT, METRICS_FILE, epoch_checkpoint_name,
                                         epoch_checkpoints, load_checkpoint, load_weights, save_checkpoint)
from cometnmt.training.distributed import (DistInfo, SyncedRunningStatistics, all_reduce_sum, any_rank,
                                          broadcast_result, ddp_buffer_sync, gather_results, peer_left)
from cometnmt.training.host_memory import keep_freed_memory
from cometnmt.training.loss import linear_cross_entropy, summed_cross_entropy
from cometnmt.training.optim import build_optimizer, build_scheduler
from cometnmt.training.run_files import metrics_line

log = logging.getLogger(__name__)


class _RanksStop(Exception):
    """Under DDP: the ranks agreed to stop for an interrupt one of them noted (see ``Trainer.fit``)."""


STOPPING_KEYS = ("stopping", "loss_rise_epochs", "patience")  # the train keys of the stopping rule

# train.precision fp16: a loss scale below this stops the run (fairseq's --min-loss-scale default). The
# scaler halves its scale at each step whose gradients overflow and doubles it only after 2,000 clean
# steps, so from 2**16 it takes about 30 skipped steps in a row: the steps' losses or gradients no
# longer fit (a diverged model, or activations past float16's 65,504), and every later step would be
# skipped too, training nothing
MIN_LOSS_SCALE = 1e-4


def compile_module(module: torch.nn.Module, mode: str) -> torch.nn.Module:
    """``torch.compile`` in one of ``train.compile_mode``'s modes ("default" = torch's default)."""
    return torch.compile(module, mode=None if mode == "default" else mode)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuple(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def device_name(device: torch.device) -> str:
    """The kind of device a run trains on, as its checkpoints record it: "cpu", or "cuda (its name)"
    (not its index: the ranks of one run, or a resume on GPU 1 of GPU 0's model, compute alike)."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def micro_batch_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of micro-batch ``index`` of ``epoch`` (a 63-bit hash, so no two of a run collide in practice)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _to_tuple(value):
    return tuple(_to_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def token_loss(logits: torch.Tensor, gold: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Summed cross-entropy over non-pad target tokens (logits B,T,V; gold B,T)."""
    return summed_cross_entropy(logits.float().flatten(0, 1), gold.flatten(), PAD, label_smoothing)


class Trainer:
    """Fits a model on encoded examples; writes checkpoints and a JSONL metrics log to train.save_dir."""

    def __init__(
        self,
        cfg: Config,
        model: Seq2Seq,
        codec: TextCodec,
        train: Examples,
        valid: Examples,
        device: torch.device,
        dist: DistInfo = DistInfo(),
    ) -> None:
        self.cfg, self.tc = cfg, cfg.train
        self.model, self.codec, self.train_data, self.valid_data = model, codec, train, valid
        self.device, self.dist = device, dist
        if device.type == "cpu":
            keep_freed_memory()  # no page faults on the step's re-allocated large tensors
        self.save_dir = Path(self.tc.save_dir)
        self.optimizer = build_optimizer(model, self.tc)
        self.scheduler = build_scheduler(self.optimizer, self.tc)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.tc.precision == "fp16")
        self._compiled = False  # set by _wrap when torch.compile wrapped the model
        self._buffer_copies: list[torch.Tensor] = []  # the buffers before a compiled step (its eager redo restores them)
        # buffers training changes (batch-norm statistics): the persistent ones; non-persistent
        # buffers (positional tables) are constants and need no copy
        self._state_buffers = set(model.state_dict(keep_vars=True))
        # reduce-overhead and max-autotune replay CUDA graphs; each micro-batch starts a new replay
        self.cuda_graphs = self.tc.compile and self.tc.compile_mode in CUDA_GRAPH_MODES and device.type == "cuda"
        self.running_stats = SyncedRunningStatistics(model, dist)  # before compiling: it sets defer_running
        self.net = self._wrap(model)
        # the CPU in float32 or bf16: the output layer and the loss in one pass over row blocks (loss.py),
        # for a model whose decode is its output layer out_proj, a linear layer, on decode_features (the
        # base class's: every built-in one; a plugin's own decode keeps its logits); elsewhere (CUDA,
        # fp16) logits and token_loss
        self.fused_loss = (device.type == "cpu" and self.tc.precision in ("fp32", "bf16")
                           and type(model).decode is Seq2Seq.decode
                           and type(getattr(model, "out_proj", None)).forward in (nn.Linear.forward, VocabProjection.forward))
        self.fused_low = torch.bfloat16 if self.tc.precision == "bf16" else None  # the fused loss's products
        self.step, self.epoch, self.consumed = 0, 0, 0  # optimizer steps; current epoch; micro-batches of it done
        self.history: list[dict] = []
        self.mid_epoch: list[dict] = []  # the valid_mid_epoch records (max_steps), outside the history
        self.best: Optional[float] = None
        self.stale = 0  # epochs of rising loss (loss_rise) or without better BLEU (bleu_patience)
        self.finished = False
        self._step_rng: Optional[dict] = None
        self._pending: list[int] = []  # under DDP: the signals noted in fit, until the ranks agree to stop
        self._ignored: set[int] = set()  # the signals ignored when fit began (not an interrupt)
        # under DDP: a training record's write whose outcome rides in the next step's all-reduce (what
        # it was, and rank 0's error or None; see _log_train_record)
        self._unlogged: Optional[tuple[str, Optional[Exception]]] = None
        self.step_extra: dict[str, torch.Tensor] = {}  # set by backward
        self.step_extra_tokens: dict[str, int] = {}  # set by backward: the tokens each auxiliary loss of the step averages over
        # Transformer++: labelled source tokens per example and tag task (a tag loss is a mean over them)
        self.tag_counts = labelled_counts(train)
        self.step_lr = 0.0  # the learning rate the last optimizer step took (set by update)
        self._new_window()
        self._saved_window: Optional[dict] = None  # a checkpoint's open log window, for the next run_epoch
        self.validated_step: Optional[int] = None  # the step of the last validation inside an epoch (max_steps)
        self.saved_step: Optional[int] = None  # the step of the last last.pt written or resumed from (for _diverged's message)
        # best.pt is not the best validation under the rule: its step, and the best record's epoch, step and
        # value (set by _align_best_checkpoint where that record's weights are gone; cleared when best.pt is next saved)
        self.best_behind: Optional[dict] = None
        self.data_digests: dict[str, str] = {}  # split -> SHA-256 of its pairs (set by run.train)
        self.init_from: Optional[str] = None  # train --init-from: the checkpoint this run started from
        # which training run the checkpoints are of (kept by a resume): `average` warns of inputs of several
        self.run_id = uuid.uuid4().hex
        self.tag_record: dict[str, dict[str, str]] = {}  # Transformer++: task -> tagger and digest of its tags (set by run.train)
        # spaCy's tokenizer of the target language for the paper metric in validation; None (BLEU and
        # chrF alone, with a warning) for a SentencePiece model of a language spaCy cannot tokenise
        self._eval_tok = paper_tokenizer(cfg.data.tgt_lang, lowercase=cfg.data.lowercase) if self.tc.valid_bleu else None

    # -- setup ---------------------------------------------------------------------------------

    def _wrap(self, model: Seq2Seq) -> torch.nn.Module:
        net: torch.nn.Module = model
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # buffers stay equal across ranks without DDP's broadcast before each forward when the
            # only ones training changes are synchronised by self.running_stats
            sync = not self.running_stats.owns_every_changing_buffer(model)
            net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp_buffer_sync(sync))
        self._eager_net = net
        if self.tc.compile:
            try:
                net = compile_module(net, self.tc.compile_mode)
                self._compiled = True
            except Exception as exc:  # pragma: no cover - depends on the platform's compiler
                log.warning("torch.compile unavailable (%s); training eagerly", exc)
        return net

    def autocast(self):
        return precision_context(self.device, self.tc.precision)

    # -- state ---------------------------------------------------------------------------------

    # what load_state_dict reads beyond the weights, config and codec, with no default (the trainer
    # section's keys under "trainer"): a resume needs it all, and an averaged checkpoint keeps none of it
    RESUME_KEYS = ("optimizer", "scheduler", "scaler", "rng", "step", "epoch", "trainer")
    RESUME_TRAINER_KEYS = ("consumed", "history", "best", "stale", "finished")

    @classmethod
    def missing_state(cls, payload: dict[str, Any]) -> list[str]:
        """The parts of a run's state that ``payload`` lacks (``trainer.consumed`` for a key of its
        trainer section), in :attr:`RESUME_KEYS`' order; [] where load_state_dict can continue it."""
        missing = [key for key in cls.RESUME_KEYS if key not in payload]
        trainer = payload.get("trainer")
        if isinstance(trainer, dict):
            missing += [f"trainer.{key}" for key in cls.RESUME_TRAINER_KEYS if key not in trainer]
        elif "trainer" not in missing:
            missing.append("trainer")
        return missing

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": to_dict(self.cfg),
            "codec": self.codec.state_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": self._step_rng or rng_state(),
            "step": self.step,
            "epoch": self.epoch,
            "workdir": os.getcwd(),  # what the config's relative data paths are relative to
            "device": device_name(self.device),  # a resume on another is warned of: it cannot continue bit-exactly
            "data_digests": self.data_digests,  # a --resume on changed files is refused
            "init_from": self.init_from,  # the checkpoint a fine-tuning run started from (None: from scratch)
            "run_id": self.run_id,
            "tags": self.tag_record,  # Transformer++: the taggers ('auto' resolved); a --resume on other tags is refused
            "trainer": {
                "consumed": self.consumed,
                "history": self.history,
                "mid_epoch": self.mid_epoch,
                "best": self.best,
                "stale": self.stale,
                "finished": self.finished,
                "window": self._window_state(),
                "validated_step": self.validated_step,
                "best_behind": self.best_behind,
            },
        }

    def load_state_dict(self, payload: dict[str, Any], path: str | Path = "the checkpoint") -> None:
        """Continue from a checkpoint's ``payload`` (read from ``path``, which a misfit of its weights names)."""
        load_weights(self.model, payload["model"], path)
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        if payload["scaler"]:  # empty from a run without fp16 (train.precision may change on a resume): a fresh scaler
            self.scaler.load_state_dict(payload["scaler"])
        self.step, self.epoch = payload["step"], payload["epoch"]
        self.saved_step = self.step
        self.init_from = payload.get("init_from")
        self.run_id = payload.get("run_id") or self.run_id  # a run from before ids were kept: one from now on
        t = payload["trainer"]
        self.consumed, self.history, self.best, self.stale, self.finished = (t[key] for key in self.RESUME_TRAINER_KEYS)
        self.mid_epoch = t.get("mid_epoch", [])  # checkpoints before it was kept: none
        self._saved_window = t.get("window")
        self.validated_step = t.get("validated_step")
        self.best_behind = t.get("best_behind")
        set_rng_state(payload["rng"])
        self._warn_other_device(payload.get("device"), path)
        saved = payload.get("config", {}).get("train", {})
        if any(key in saved and saved[key] != getattr(self.tc, key) for key in STOPPING_KEYS):
            # a rule of another measure (validation loss, BLEU) has another best validation than best.pt's
            by_bleu = (saved.get("stopping") == "bleu_patience", self.tc.stopping == "bleu_patience")
            self._rescore_history(measure_changed=by_bleu[0] != by_bleu[1])

    def _warn_other_device(self, saved: str | None, path: str | Path) -> None:
        """A resume on another kind of device than the run trained on (CUDA then CPU, or another
        GPU) goes on, but cannot continue bit-exactly: other kernels round otherwise, and the CPU's
        and CUDA's random streams differ. It was accepted without a word; it is now one warning
        naming both. Checkpoints written before the device was recorded (None): none."""
        now = device_name(self.device)
        if saved is not None and saved != now:
            log.warning("%s: the run trained on %s and resumes on %s; it goes on, but not bit-exactly as it would "
                        "on %s", path, saved, now, saved)

    def _rescore_history(self, measure_changed: bool = False) -> None:
        """A resume under another stopping rule than the run's (train.stopping, loss_rise_epochs or
        patience): replay the epochs' records under this rule. The saved best and stale count may
        be in the other number (a BLEU of 30 read as a loss made the next epoch "best" whatever its
        loss), and ``finished`` is the old rule's: a run stopped by it and resumed with
        ``train.stopping=none``, or a larger patience, and a larger max_epochs trained nothing
        ("already finished ... its stopping rule"). The max_steps validations inside an epoch
        (``valid_mid_epoch``) count for the best, in their place among the epochs, as they did when
        run: before, they were left out, and with the rule's measure unchanged (a new
        loss_rise_epochs or patience) the next epoch better than the epochs' best overwrote a
        better mid-epoch best.pt. Records without a validation BLEU are passed over. Where the
        measure changed (``measure_changed``: loss, BLEU), best.pt holds another validation than
        the replayed best: see :meth:`_align_best_checkpoint`."""
        history = self.history
        self.best, self.stale, self.finished = None, 0, False
        scored = lambda record: self.tc.stopping != "bleu_patience" or "val_bleu" in record  # noqa: E731
        pending = [r for r in sorted(self.mid_epoch, key=lambda r: (r["epoch"], r["step"])) if scored(r)]
        best = None
        for i, record in enumerate(history):
            while pending and pending[0]["epoch"] <= record["epoch"]:  # validated inside this epoch (or at its start)
                mid = pending.pop(0)
                best = mid if self._update_best(mid) else best
            if not scored(record):
                continue
            self.history = history[: i + 1]  # update_stopping compares with the record before
            best = record if self.update_stopping(record) else best
        for record in pending:
            best = record if self._update_best(record) else best
        self.history = history
        if measure_changed and not self.done:  # a resume that trains nothing keeps the run (config.yaml too) as it was
            self._align_best_checkpoint(best)

    def _align_best_checkpoint(self, best: Optional[dict]) -> None:
        """After a replay under another stopping rule: make best.pt the replayed ``best`` record's
        model. A rule of another measure (loss_rise or none against bleu_patience) has another best
        validation, but best.pt stayed the old measure's, and a later validation replaced it only
        if it beat the new best: a run resumed from loss to BLEU kept its lowest-loss epoch as the
        "best-validation-BLEU checkpoint" that reports decoded. Where that epoch's checkpoint
        (``train.keep_checkpoints``) is still there it is copied to best.pt; else a warning says
        so, and ``best_behind`` (in last.pt, for the reports) notes it until best.pt is next saved.
        Rank 0 reads, copies and decides; every rank receives ``best_behind`` or its error (a full
        disk) from it (:func:`broadcast_result`): raised on rank 0 alone, the others failed in their
        next collective with gloo's "Connection closed by peer", and a rank reading best.pt itself
        could find rank 0's copy there already and skip the exchange."""
        path = self.save_dir / BEST_CHECKPOINT
        self.best_behind = broadcast_result(lambda: self._aligned_best_behind(best, path), self.dist,
                                            f"making {path} the model of the best validation")

    def _aligned_best_behind(self, best: Optional[dict], path: Path) -> Optional[dict]:
        """:meth:`_align_best_checkpoint` on rank 0: best.pt (``path``) aligned where it can be, and
        the ``best_behind`` that follows."""
        if best is None or not path.is_file():
            return self.best_behind
        held = load_checkpoint(path, mmap=True)["step"]  # the steps: the weights are not read
        if held == best["step"]:
            return None
        kept = self.save_dir / epoch_checkpoint_name(best["epoch"])
        if best["event"] == "valid" and kept.is_file() and load_checkpoint(kept, mmap=True)["step"] == best["step"]:
            with deferred():
                save_checkpoint(load_checkpoint(kept), path)
            log.info("%s is now %s (epoch %d, step %d): the best validation under train.stopping=%s", BEST_CHECKPOINT,
                     kept.name, best["epoch"], best["step"], self.tc.stopping)
            return None
        measure = "val_bleu" if self.tc.stopping == "bleu_patience" else "val_loss"
        log.warning("%s holds the model of step %d, the best under the run's earlier stopping rule; under "
                    "train.stopping=%s the best validation is %s %.4g at step %d (epoch %d), whose weights were not "
                    "kept (train.keep_checkpoints): %s stays as it is until a validation beats %.4g", BEST_CHECKPOINT,
                    held, self.tc.stopping, measure, best[measure], best["step"], best["epoch"], BEST_CHECKPOINT, best[measure])
        return {"held_step": held, "best_epoch": best["epoch"], "best_step": best["step"],
                "measure": measure, "value": best[measure], "stopping": self.tc.stopping}

    def _new_window(self) -> None:
        """Start a metrics-log window: the summed loss, auxiliary losses and target tokens of its
        steps (and the tokens each auxiliary loss averages over), and its start; and how many of its
        steps had a loss that is not a number, and the first of them (0: none), counted on the
        device and read with the record (:meth:`_diverged`)."""
        self.window_loss, self.window_tokens, self.window_start = torch.zeros((), device=self.device), 0, time.perf_counter()
        self.window_nonfinite = torch.zeros((), dtype=torch.int64, device=self.device)
        self.window_first_nonfinite = torch.zeros((), dtype=torch.int64, device=self.device)
        self.window_extra: dict[str, torch.Tensor] = {}
        self.window_extra_tokens: dict[str, int] = {}

    def _window_state(self) -> Optional[dict]:
        """The log window a checkpoint is written inside (Ctrl-C, save_every, max_steps), so that the
        resumed run's next record covers the same steps as an uninterrupted run's; before, it covered
        only the steps since the resume and the ones before were never logged. Under DDP too: the
        window's sums cover every rank (each step's losses are all-reduced); before, each rank held
        only its own micro-batches' losses, no window was saved, and the first record after a resume
        covered only the steps since it. None for an empty window."""
        if not self.window_tokens:
            return None
        return {"loss": float(self.window_loss), "tokens": self.window_tokens,
                "extra": {k: float(v) for k, v in self.window_extra.items()},
                "extra_tokens": dict(self.window_extra_tokens),
                "seconds": time.perf_counter() - self.window_start,
                "nonfinite_steps": int(self.window_nonfinite), "first_nonfinite_step": int(self.window_first_nonfinite)}

    def _resume_window(self, saved: dict) -> None:
        """Reopen a checkpoint's log window. Its sums cover every rank of the run that saved it, as
        every rank's window does (each step's losses are summed over the ranks): each rank takes them."""
        self.window_tokens = saved["tokens"]
        self.window_start -= saved["seconds"]
        self.window_loss += saved["loss"]
        self.window_extra = {k: torch.tensor(v, device=self.device) for k, v in saved["extra"].items()}
        self.window_nonfinite += saved.get("nonfinite_steps", 0)  # a window saved before they were counted: none
        self.window_first_nonfinite += saved.get("first_nonfinite_step", 0)
        # a window saved before the tag losses were averaged over labelled tokens: its sums were per target token
        self.window_extra_tokens = {k: saved.get("extra_tokens", {}).get(k, saved["tokens"]) for k in saved["extra"]}

    def save(self, name: str) -> None:
        if self.dist.is_main:
            with deferred():  # an interrupt would abort the write (it is atomic: the old file stays)
                save_checkpoint(self.state_dict(), self.save_dir / name)

    def _write_on_rank_zero(self, write: Callable[[], None], doing: str) -> None:
        """``write()`` (checkpoints, metrics.jsonl: rank 0's files) on rank 0, whose success or error
        every rank receives (:func:`broadcast_result`): a failure (a full disk) stops every rank at
        once ("rank 0 failed DOING: OSError: ..."). Raised on rank 0 alone, it left the others to fail
        in their next collective with gloo's "Connection closed by peer". ``write()`` in one process."""
        broadcast_result(write, self.dist, doing)

    def drop_records_after_checkpoint(self) -> None:
        """On a resume, remove from metrics.jsonl the records the checkpoint does not include: those
        a run killed without saving (``kill -9``, a lost machine) logged after its last ``save_every``
        or epoch checkpoint. The resume trains those steps again and logs them anew; before, their
        records stood twice (step 3, 3, 4, ...), and learning curves drawn from the log doubled back.
        Rank 0 rewrites it; a failure stops every rank (:meth:`_write_on_rank_zero`)."""
        path = self.save_dir / METRICS_FILE
        self._write_on_rank_zero(lambda: self._drop_records(path),
                                 f"removing the records past step {self.step} from {path}")

    def _drop_records(self, path: Path) -> None:
        """:meth:`drop_records_after_checkpoint` on rank 0."""
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        kept = [line for line in lines if self._before_checkpoint(line)]
        if len(kept) < len(lines):
            log.info("%s: %d record(s) past the checkpoint (step %d) removed; the resume logs them again",
                     METRICS_FILE, len(lines) - len(kept), self.step)
            with atomic_write(path) as f:
                f.write("".join(line + "\n" for line in kept))

    def _before_checkpoint(self, line: str) -> bool:
        """Whether a metrics record was logged at or before the position this trainer holds. A line
        that is not a whole record was cut by the kill (it is the last one written): dropped."""
        try:
            record = json.loads(line)
        except ValueError:
            return False
        if not isinstance(record, dict):
            return False
        if record.get("event") == "valid":  # logged with the checkpoint that counts its epoch done
            return record["epoch"] <= self.epoch
        if record.get("event") == "valid_mid_epoch":  # logged with the last.pt that notes it (validated_step)
            return record["step"] < self.step or record["step"] == self.validated_step
        return record.get("step", 0) <= self.step

    def log_metrics(self, record: dict) -> None:
        """Append ``record`` to metrics.jsonl on rank 0, as valid JSON: a number that is not finite
        (a diverged loss) as null, named under ``nonfinite`` (:func:`run_files.metrics_line`); json.dumps
        wrote a bare NaN, which strict readers refuse. An OSError names the file: a full disk
        failed in the write with "[Errno 28] No space left on device" and no file."""
        if self.dist.is_main:
            path = self.save_dir / METRICS_FILE
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(metrics_line(record) + "\n")
            except OSError as exc:
                if exc.filename is not None or exc.errno is None:
                    raise
                raise OSError(exc.errno, exc.strerror, str(path)) from exc

    def _log_train_record(self, record: dict, carry: bool) -> None:
        """Write a training record (:meth:`log_metrics`). Under DDP a failure on rank 0 (a full disk)
        stops every rank with its error, the others with "rank 0 failed writing the record of step N
        to metrics.jsonl: OSError: ..."; raised on rank 0 alone, it left the others to fail in their
        next collective with gloo's "Connection closed by peer". With ``carry`` (another step of the
        loop comes next, and no checkpoint before it) the outcome rides in that step's all-reduce of
        its losses, a flag (:meth:`_unlogged_flag`), and the ranks stop after it: a broadcast of its
        own at every record cost as much as that all-reduce (1.5 ms against 1.2-1.4 ms on gloo,
        two CPU ranks), at each step with train.log_every=1. Else (the loop's last step, an
        interrupt, save_every next) rank 0 sends it at once (:meth:`_write_on_rank_zero`): no stop
        or checkpoint passes a record that was not written.

        A carried failure lets every rank train one step more, rank 0 included (its optimizer step
        and batch-norm statistics applied in memory), and that step leaves nothing behind: the ranks
        raise in its all-reduce (:meth:`_raise_unlogged`), before its record, its save_every last.pt
        and the stop an interrupt noted in it would bring (the failure is raised first: the stop
        would save last.pt, the step's weights beside a missing record); the error passes fit's
        KeyboardInterrupt handler, the only save left, and ``run.train`` drops the trainer. So
        metrics.jsonl ends before the failed record (a part of it at most, which a ``--resume``
        drops as a cut line), last.pt, where there is one, is of a step before it, and the errors
        name the failed record's step, not the one trained after it."""
        doing = f"writing the record of step {self.step} to {METRICS_FILE}"
        if not (carry and self.dist.enabled):
            self._write_on_rank_zero(lambda: self.log_metrics(record), doing)
            return
        error = None
        if self.dist.is_main:
            try:
                self.log_metrics(record)
            except Exception as exc:  # every rank learns of it in the next step's all-reduce
                error = exc
        self._unlogged = (doing, error)

    def _unlogged_flag(self) -> torch.Tensor:
        """1 (on the device) if this rank failed the write :meth:`_log_train_record` carried, else 0."""
        failed = self._unlogged is not None and self._unlogged[1] is not None
        return (torch.ones if failed else torch.zeros)((), device=self.device)

    def _raise_unlogged(self) -> None:
        """Every rank, after a step's all-reduce said a carried write failed: rank 0 raises its error,
        the others a copy naming it (:func:`broadcast_result`)."""
        doing, error = self._unlogged

        def again() -> None:
            raise error

        broadcast_result(again, self.dist, doing)

    # -- divergence ----------------------------------------------------------------------------

    def _kept(self) -> str:
        """What a stop for divergence leaves of the run: which last.pt, and how to go on."""
        kept = (f"{self.save_dir / LAST_CHECKPOINT} (step {self.saved_step}) is the last checkpoint, kept as it was"
                if self.saved_step is not None else "no checkpoint had been written")
        return (f"{kept}; lower train.lr or raise train.warmup_steps (a new run), or set a lower train.clip_norm (a --resume "
                "may change it: resumed as it was, training is deterministic and diverges again at the same step)")

    def _diverged(self, record: dict, nonfinite: int, first: int) -> Optional[str]:
        """The message of :class:`TrainingDiverged` for the training ``record`` about to be logged,
        or None where the run goes on. ``nonfinite``: how many of the record's steps had a loss (or
        auxiliary loss) that is not a number; ``first``: the first of them (0: not counted, a log
        window a checkpoint from before this was counted in left open).

        Checked at each record (``train.log_every``, an epoch's end, max_steps): the losses are read
        back from the device there, not at each step (a host sync a step stalls a GPU's queue), so a
        run stops at most log_every steps after the first loss that is not a number; no checkpoint
        is written in between (:meth:`_check_weights`).

        - fp32 and bf16: a loss that is not a number stops the run. Its gradients are not numbers
          either, the optimizer applied them, and weights that hold NaN stay NaN: before, a run under
          ``train.stopping: none`` trained on them to max_epochs, overwriting last.pt (and best.pt,
          whose ``loss < NaN`` comparison no later epoch won: see :meth:`improves`) with NaN weights.
        - fp16: the loss scaler skips a step whose loss or gradients overflowed, leaving the weights
          unharmed, so such a record is a warning and the run goes on; it stops once the loss scale
          falls below MIN_LOSS_SCALE (every step overflowing), as fairseq's "Minimum loss scale
          reached" does.

        Under DDP every rank takes the same decision without a collective of its own: the losses
        were all-reduced at each step and every rank's scaler saw the same (all-reduced) gradients."""
        bad = {k: v for k, v in record.items() if k.startswith("loss") and not math.isfinite(v)}
        shown = ", ".join(f"{k} {v}" for k, v in bad.items())
        where = (f"first at step {first}, {nonfinite} of the log window's steps" if first
                 else "in the log window")
        if self.scaler.is_enabled():
            if bad:
                log.warning("step %d: the training loss is not a number (%s; %s); under train.precision fp16 the "
                            "loss scaler skipped those steps' updates, and training goes on", self.step, shown, where)
            scale = self.scaler.get_scale()
            if scale >= MIN_LOSS_SCALE:
                return None
            return (f"training stopped at step {self.step} (epoch {self.epoch + 1}): the fp16 loss scale fell to "
                    f"{scale:g}, below {MIN_LOSS_SCALE:g}: the loss scaler halves it at every step whose gradients "
                    f"overflow and skips that step, so the steps kept overflowing"
                    + (f" (the training loss is not a number: {shown}; {where})" if bad else "")
                    + "; the model diverged or no longer fits float16 (train.precision bf16 or fp32 holds larger numbers); "
                    + self._kept())
        if not bad:
            return None
        return (f"training stopped at step {self.step} (epoch {self.epoch + 1}): the training loss is not a number "
                f"({shown}; {where}): the model diverged, and its weights, updated with that loss's gradients, are "
                f"no longer finite either; " + self._kept())

    def _nonfinite_weight(self) -> Optional[str]:
        """The name of the model's first weight or buffer (batch-norm statistics) holding NaN or an
        infinity, or None. One pass (the largest magnitude of each, which is NaN or infinite where an
        element is, and finite for any finite weights) and one host sync."""
        named = [(k, v) for k, v in self.model.state_dict().items() if v.is_floating_point() and v.numel()]
        if not named:
            return None
        peaks = torch._foreach_norm([v for _, v in named], float("inf"))
        finite = torch.isfinite(torch.stack([p.float() for p in peaks]))
        if bool(finite.all()):
            return None
        return named[int((~finite).nonzero()[0])][0]

    def _weights_message(self, name: str, doing: str) -> str:
        first = int(self.window_first_nonfinite)
        loss = f"; the training loss was first not a number at step {first}" if first else ""
        return (f"training stopped at step {self.step} (epoch {self.epoch + 1}): the model's weights are no longer "
                f"finite ({name} holds NaN or an infinity){loss}: the model diverged; not {doing}, so the "
                f"checkpoints hold no such weights; " + self._kept())

    def _check_weights(self, doing: str) -> None:
        """Before a checkpoint is written (``doing``: what would be): stop with TrainingDiverged where
        the weights are not finite, writing nothing. A loss that is not a number stops the run at
        its record (:meth:`_diverged`), but a checkpoint can come first (train.save_every between two
        records), and a step's update can make the weights NaN from gradients that overflowed while
        its loss was finite. Every rank checks its own copy (DDP keeps them equal), so every rank stops
        together; nothing else a step is read back."""
        name = self._nonfinite_weight()
        if name is not None:
            raise TrainingDiverged(self._weights_message(name, doing))

    # -- batches -------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        d = self.train_data  # the last step may have fewer micro-batches than accum_steps * world_size (see backward)
        return make_batches(
            [len(s) for s in d.src_ids],
            [len(t) for t in d.tgt_ids],
            max_tokens=self.tc.batch_tokens,
            max_sentences=self.tc.batch_sentences,
            shuffle=True,
            seed=self.tc.seed * 100003 + epoch,
            bucket_width=self.tc.bucket_width,
        )

    def collate(self, idx: list[int]) -> Batch:
        d = self.train_data
        batch = collate([d.src_ids[i] for i in idx], [d.tgt_ids[i] for i in idx], idx, tags=select_tags(d, idx))
        if self.device.type == "cuda":
            batch = batch.pin_memory()
        return batch.to(self.device, non_blocking=True)

    # -- one optimizer step --------------------------------------------------------------------

    def train_step(self, group: list[list[int]]) -> tuple[torch.Tensor, int]:
        """Forward/backward the micro-batches of one global step and update the weights; returns
        (this rank's summed loss, target tokens of the whole global step)."""
        n_tokens = sum(sum(len(self.train_data.tgt_ids[i]) + 1 for i in idx) for idx in group)
        total = self._compiled_backward(group, n_tokens) if self._compiled else self.backward(group, n_tokens)
        A = self.tc.accum_steps
        self.running_stats.end_step([len(group[r * A : (r + 1) * A]) for r in range(self.dist.world_size)])
        self.update()
        return total, n_tokens

    def update(self) -> None:
        """After ``backward``: clip the gradients, step the optimizer and the schedule, clear the gradients.

        Under ``train.precision: fp16`` the loss scaler skips a step whose gradients overflowed (and
        halves its scale); the schedule then stays where it is, as in fairseq, so that it counts the
        updates applied (warmup included). Before, it moved on, and every skipped step put the rate
        of the later updates one step further along (``step`` counts the skipped step: it is the
        run's position in the data, for the log, checkpoints and max_steps)."""
        self.scaler.unscale_(self.optimizer)
        if self.tc.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm)
        # the step's own rate, for the log: after scheduler.step() the optimizer holds the next step's
        self.step_lr = self.optimizer.param_groups[0]["lr"]
        scale = self.scaler.get_scale()  # 1.0 (no host sync) unless fp16
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if not self.scaler.is_enabled() or self.scaler.get_scale() >= scale:  # a skip lowers the scale, else it stays or grows
            self.scheduler.step()

    def _compiled_backward(self, group: list[list[int]], n_tokens: int) -> torch.Tensor:
        """``backward`` through the compiled model. torch.compile compiles at the first call (and
        recompiles for new shapes), so that is where it fails; then warn, drop the step's partial
        gradients, restore the RNG and buffers (batch-norm statistics) and redo it eagerly."""
        rng = rng_state()
        buffers = [b for name, b in self.model.named_buffers() if name in self._state_buffers]
        if [(c.shape, c.dtype, c.device) for c in self._buffer_copies] != [(b.shape, b.dtype, b.device) for b in buffers]:
            self._buffer_copies = [torch.empty_like(b) for b in buffers]
        if buffers:  # one fused copy per dtype instead of a clone per buffer (COMET has 18)
            torch._foreach_copy_(self._buffer_copies, buffers)
        try:
            return self.backward(group, n_tokens)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            log.warning("torch.compile failed at step %d (%s: %s); training eagerly", self.step + 1, type(exc).__name__, first)
            self.net, self._compiled = self._eager_net, False
            self.optimizer.zero_grad(set_to_none=True)
            set_rng_state(rng)
            if buffers:
                with torch.no_grad():
                    torch._foreach_copy_(buffers, self._buffer_copies)
            return self.backward(group, n_tokens)

    def backward(self, group: list[list[int]], n_tokens: int) -> torch.Tensor:
        """Accumulate the gradients of this rank's micro-batches of ``group``; returns their summed loss."""
        A = self.tc.accum_steps
        start = self.dist.rank * A if self.dist.enabled else 0
        mine = group[start : start + A] if self.dist.enabled else group
        first = self.consumed + start  # the index in the epoch of mine[0]
        share = 1.0
        if not mine:  # a short last step (or a resume at another world size) left this rank nothing:
            mine, share = group[:1], 0.0  # it still joins DDP's all-reduce, with a zero gradient
        total = torch.zeros((), device=self.device)
        # A tag loss is a mean over the micro-batch's labelled source tokens: weighed by its share of
        # the step's (every rank's), the step's objective holds the mean over all of them, as one
        # batch of the step's micro-batches would. Other auxiliary losses weigh by target tokens.
        step_tags = {task: sum(counts[i] for idx in group for i in idx) for task, counts in self.tag_counts.items()}
        self.step_extra = {}  # auxiliary losses x the tokens they average over, summed (for the log)
        self.step_extra_tokens = {}
        self.running_stats.start_step()
        for i, idx in enumerate(mine):
            torch.manual_seed(micro_batch_seed(self.tc.seed, self.epoch, first + i))  # the same masks on any rank
            batch = self.collate(idx)
            sync = i == len(mine) - 1 or not self.dist.enabled
            if self.cuda_graphs and self._compiled:  # the last micro-batch's graph outputs are dead by now
                torch.compiler.cudagraph_mark_step_begin()
            with (nullcontext() if sync else self.net.no_sync()), self.autocast():
                extra = {"tags": batch.tags} if batch.tags else {}  # Transformer++ POS/NER targets
                if self.fused_loss:  # only then: a plugin's forward need not take features_only
                    extra["features_only"] = True
                out = self.net(batch.src, self.model.training_source_mask(batch), batch.tgt_in, **extra)  # B,T,D or B,T,V
                if self.fused_loss:  # the output layer inside the loss: no B,T,V logits
                    proj = self.model.out_proj
                    loss = linear_cross_entropy(out.flatten(0, 1), proj.weight, proj.bias, batch.tgt_out.flatten(),
                                                PAD, self.tc.label_smoothing, low=self.fused_low)
                else:
                    loss = token_loss(out, batch.tgt_out, self.tc.label_smoothing)
                objective = loss / n_tokens
                for name, (value, weight) in self.model.extra_losses().items():
                    if name in step_tags:
                        count, step_count = sum(self.tag_counts[name][j] for j in idx), step_tags[name]
                    else:
                        count, step_count = batch.n_tgt_tokens, n_tokens
                    objective = objective + weight * value * (count / max(step_count, 1))
                    weighted = value.detach().float() * (count * share)
                    self.step_extra[name] = self.step_extra.get(name, 0.0) + weighted
                    self.step_extra_tokens[name] = step_count
            self.scaler.scale(objective * (self.dist.world_size * share)).backward()  # DDP averages over ranks
            if share:  # a zero-weighted micro-batch leaves the batch-norm statistics alone
                self.running_stats.record()
            total += loss.detach() * share
            if i == 0 and len(mine) > 1 and self.cuda_graphs and self._compiled:
                self._grads_out_of_graph_pool()
        return total

    def _grads_out_of_graph_pool(self) -> None:
        """Copy the gradients of a step's first micro-batch out of the CUDA graphs' memory pool.

        The first backward leaves each ``.grad`` undefined, so autograd does not copy the gradient
        the backward graph returns but installs that very tensor, which lives in the graphs' pool
        and is overwritten by the next micro-batch's replay (pytorch/pytorch#169545): accumulation
        would then add a gradient to itself, or fail with "accessing tensor output of CUDAGraphs
        that has been overwritten". Once each ``.grad`` is our own tensor, the later micro-batches
        add into it in place. One fused copy; parameters without a gradient keep ``None``."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        own = [torch.empty_like(g) for g in grads]
        torch._foreach_copy_(own, grads)
        for p, g in zip(params, own):
            p.grad = g

    # -- the loop ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The stopping rule fired or train.max_epochs epochs are trained (max_steps stops an epoch
        early, but a resume with a larger one goes on)."""
        return self.finished or self.epoch >= self.tc.max_epochs

    def fit(self, signals: HandOver | None = None) -> dict:
        """Train until the stopping rule, max_epochs or max_steps. Ctrl-C/SIGTERM saves `last.pt`.

        ``signals``: under DDP, those the set-up noted (``run._SetUp.hand_over``) up to here, still
        noted until fit's own handlers are in place: fit counts them as its own, so the first
        step's all-reduce stops every rank for one that came as training began."""
        make_folder(self.save_dir)
        if self.cuda_graphs and self._compiled:
            self._expect_graph_per_shape()
        # signals after the first are held off while it is handled: one already pending when the
        # first was raised (SIGINT and reproduce's SIGTERM together) landed in the handler below,
        # before the save, and last.pt was never written
        # Under DDP a rank stops only where every rank stops: a signal is noted (in self._pending)
        # and the ranks agree at the next step's all-reduce, or after a validation, to stop there
        # together. Stopping on its own, a rank left the others waiting in the next step's
        # collective, which failed with gloo's "Connection closed by peer" traceback once it exited;
        # and where rank 0 was the one left (a SIGTERM that reached rank 1 first, or rank 1 alone),
        # it died there without saving last.pt.
        self._ignored = ignored() if signals is None else signals.ignored  # the set-up's handler hides SIG_IGN
        with first_raises() as later:
            try:
                peers = False
                try:
                    with deferred(redeliver=False) if self.dist.enabled else nullcontext([]) as self._pending:
                        if signals is not None:
                            self._pending.extend(signals.take())
                        try:
                            while not self.done:
                                if not self.run_epoch():
                                    break  # max_steps; not `finished`, so a resume with a larger max_steps goes on
                                self.end_epoch()
                            # one noted during the last checkpoints: every rank stops, or none (a rank that
                            # finished cleanly waits for the others at shutdown's barrier)
                            self._stop_together()
                        except _RanksStop:
                            peers = not self._interrupted()
                except Exception as failure:
                    # a collective that failed for a rank that left: said in one line (distributed.PeerLeft)
                    left = peer_left(failure, self.dist)
                    if left is not None:
                        left.__cause__ = failure  # gloo's error, for a caller's traceback
                    # under DDP a failure while this rank held its own signal (a step's, noted here): the
                    # signal is raised from the failure, as one process raises it (interrupts.deferred), so
                    # the rank exits 130/143 with the failure reported, not 1 with the signal dropped
                    raise_noted(self._own_signals(), failure if left is None else left)
                    if left is None:
                        raise
                    raise left from failure
                raise_noted(self._own_signals())  # this rank's own, as it would have been raised
                if peers:
                    log.warning("rank %d: another rank was interrupted; every rank stops at step %d",
                                self.dist.rank, self.step)
                    raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                if isinstance(exc.__cause__, Exception):  # it came during a failure (interrupts.deferred): the
                    # run stops, saving nothing, as for the failure alone (a last.pt past the failed record or write)
                    log.warning("interrupted at step %d during a failure (%s); nothing saved", self.step,
                                type(exc.__cause__).__name__)
                    raise
                log.warning("interrupted at step %d; %s %s", self.step, "saving" if self.dist.is_main else
                            f"rank {self.dist.rank} stops, rank 0 saves", self.save_dir / LAST_CHECKPOINT)
                self._save_interrupted(later)
                raise
        return self.summary()

    def _own_signals(self) -> list[int]:
        """The signals fit noted on this rank that are not ignored (under DDP; none in one process)."""
        return [signum for signum in self._pending if signum not in self._ignored]

    def _interrupted(self, noted: list[int] = ()) -> bool:
        """Whether this rank holds an interrupt: a signal noted in fit (or in ``noted``, a step's) that is not ignored."""
        return any(signum not in self._ignored for signum in (*self._pending, *noted))

    def _interrupt_flag(self, noted: list[int] = ()) -> torch.Tensor:
        """:meth:`_interrupted` as a 0-dim 1 or 0 on the device, for the step's all-reduce of its losses,
        whose sum then says whether any rank holds one (made on the device: no host-to-device copy in
        the step); outside a step, :func:`any_rank` asks it alone."""
        return (torch.ones if self._interrupted(noted) else torch.zeros)((), device=self.device)

    def _stop_together(self) -> None:
        """Under DDP, after a validation (a signal there is only noted, so every rank goes through its
        collectives: the gather of the ranks' translations and the broadcast of rank 0's scores) and
        at the run's end: stop every rank if one of them holds an interrupt (see ``fit``)."""
        if self.dist.enabled:
            if any_rank(self._interrupted(), self.dist, self.device):
                raise _RanksStop

    def _save_interrupted(self, later: list[int]) -> None:
        """Save ``last.pt`` after an interrupt; a second Ctrl-C, or the SIGTERM `reproduce` sends
        its trainings after the terminal's SIGINT reached them, is ignored until the file is
        written (it aborted the write, and the run resumed from an older checkpoint). ``later``:
        the signals :func:`first_raises` noted after the first."""
        with deferred(redeliver=False) as noted:
            if self.dist.is_main:
                weight = self._nonfinite_weight()
                if weight is None:
                    save_checkpoint(self.state_dict(), self.save_dir / LAST_CHECKPOINT)
                else:  # the interrupt still stops the run (130, 143); its resume continues the last good one
                    log.error("%s", self._weights_message(weight, f"writing {LAST_CHECKPOINT} on the interrupt"))
        if noted or later:
            log.warning("a further interrupt arrived while %s was saved; ignored", self.save_dir / LAST_CHECKPOINT)

    def batch_shapes(self, batches: list[list[int]]) -> set[tuple[int, int, int]]:
        """The distinct (sentences, longest source, longest target) of ``batches``: one per tensor shape."""
        d = self.train_data
        return {(len(idx), max(len(d.src_ids[i]) for i in idx), max(len(d.tgt_ids[i]) for i in idx)) for idx in batches}

    def _expect_graph_per_shape(self) -> None:
        """CUDA graphs record one graph per batch shape, and torch warns at each new shape past 8
        (``cudagraph_dynamic_shape_warn_limit``), which would repeat for most of epoch 1: Multi30k's
        2,048-token batches have 141 shapes. With ``train.bucket_width`` 1 (the default) the
        batches are cut from examples sorted by their exact lengths, shuffled only among equal
        lengths, so every epoch has the same shapes and epoch 1's graphs serve all later epochs:
        say how many once, and silence torch's per-shape warning."""
        import torch._inductor.config as inductor_config

        inductor_config.triton.cudagraph_dynamic_shape_warn_limit = None
        n = len(self.batch_shapes(self.epoch_batches(self.epoch)))
        log.info("CUDA graphs: %d batch shapes, each recorded once (padded and unpadded sources apart) and replayed after", n)

    def _steps_left(self) -> bool:
        return self.tc.max_steps is None or self.step < self.tc.max_steps

    def run_epoch(self) -> bool:
        """Train the rest of the current epoch; False (after saving `last.pt`) if max_steps stopped it."""
        batches = self.epoch_batches(self.epoch)
        G = self.tc.accum_steps * self.dist.world_size
        n_steps = math.ceil(len(batches) / G)
        bar = progress_bar(total=n_steps, initial=self.consumed // G, desc=f"epoch {self.epoch + 1}", unit="step",
                   disable=not (self.tc.progress and self.dist.is_main), dynamic_ncols=True)
        self._new_window()
        if self._saved_window is not None:
            self._resume_window(self._saved_window)
            self._saved_window = None
        while self.consumed < len(batches):
            if not self._steps_left():
                bar.close()
                self.end_at_max_steps()
                return False
            group = batches[self.consumed : self.consumed + G]
            self.net.train()
            # a step is whole or not begun, its share of the log window and its record included:
            # Ctrl-C/SIGTERM waits for its end (the interrupt came after the step's count, so a
            # step it landed in was missing from the saved window, and its record was never logged)
            stop = False
            with deferred() as noted:
                self._step_rng = rng_state()
                loss, n_tokens = self.train_step(group)
                self._step_rng = None
                if self.dist.enabled:
                    # the step's losses of every rank, in one small all-reduce: each rank's window then
                    # covers all ranks, and so does the one rank 0 saves in last.pt at any step; with
                    # them, whether a rank holds an interrupt (fit): then every rank stops after this step;
                    # and whether rank 0 failed to write the last step's record (_log_train_record)
                    sums = all_reduce_sum(torch.stack([loss.float(), *self.step_extra.values(), self._interrupt_flag(noted),
                                                       self._unlogged_flag()]), self.dist)
                    loss, self.step_extra = sums[0], dict(zip(self.step_extra, sums[1:-2]))
                    stop, unlogged = (flag > 0 for flag in sums[-2:].tolist())  # one host sync
                    if unlogged:  # before the stop: this step is saved nowhere (see _log_train_record)
                        self._raise_unlogged()
                    self._unlogged = None
                # counted once its all-reduce passed: a rank whose all-reduce failed for a peer that failed
                # in this step names the same step as that peer (it named the next: "interrupted at step
                # 2 during a failure" beside the failed rank's "step 1")
                self.step += 1
                self.consumed += len(group)
                self.window_loss += loss
                self.window_tokens += n_tokens
                for name, value in self.step_extra.items():
                    self.window_extra[name] = self.window_extra.get(name, 0.0) + value
                    self.window_extra_tokens[name] = self.window_extra_tokens.get(name, 0) + self.step_extra_tokens[name]
                # whether the step's loss or an auxiliary loss is not a number (their sum is not then), counted
                # on the device: no host sync a step; the record reads it (under DDP the summed losses: every
                # rank counts alike)
                bad = ~torch.isfinite(sum((v.float() for v in self.step_extra.values()), loss.float()))
                self.window_first_nonfinite = torch.where(bad & (self.window_nonfinite == 0), self.step,
                                                          self.window_first_nonfinite)
                self.window_nonfinite += bad
                bar.update(1)
                # the epoch's last step and max_steps' last step end a window too (a run max_steps ended
                # inside its first window logged no training loss at all)
                if self.step % self.tc.log_every == 0 or self.consumed >= len(batches) or not self._steps_left():
                    seconds = time.perf_counter() - self.window_start
                    # the window's loss and auxiliary losses (Transformer++'s tag losses), summed over
                    # ranks (step by step, above), and its count of steps whose losses were not numbers and
                    # the first of them, read in one host sync (float64: the float32 sums as they are)
                    *sums, nonfinite, first_nonfinite = torch.stack([t.double() for t in (
                        self.window_loss, *self.window_extra.values(), self.window_nonfinite,
                        self.window_first_nonfinite)]).tolist()
                    record = {
                        "event": "train", "step": self.step, "epoch": self.epoch + 1,
                        "loss": sums[0] / max(self.window_tokens, 1),
                        "lr": self.step_lr,  # the rate of the record's step (get_last_lr() is the next step's)
                        "tgt_tokens_per_s": self.window_tokens / max(seconds, 1e-9),  # window_tokens counts all ranks
                    }
                    # per token they average over (target tokens; a tag loss's labelled source tokens), weighted as the
                    # objective weights them: the window's mean, not its last micro-batch's
                    record.update({f"loss_{k}": v / max(self.window_extra_tokens.get(k, 0), 1)
                                   for k, v in zip(self.window_extra, sums[1:])})
                    diverged = self._diverged(record, int(nonfinite), int(first_nonfinite))
                    # another step of this loop comes next, and no checkpoint before it
                    carry = (not stop and not diverged and self.consumed < len(batches) and self._steps_left()
                             and not (self.tc.save_every and self.step % self.tc.save_every == 0))
                    self._log_train_record(record, carry)  # logged first: the record shows the loss the error names
                    if diverged:  # every rank: each read the same summed losses and loss scale
                        raise TrainingDiverged(diverged)
                    bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tgt_tokens_per_s']:.0f}",
                                    refresh=False)  # shown at the bar's next redraw, not a frame of its own
                    self._new_window()
            if stop:
                bar.close()
                raise _RanksStop
            if self.tc.save_every and self.step % self.tc.save_every == 0:
                saving = time.perf_counter()
                self._check_weights(f"writing {LAST_CHECKPOINT}")
                self._write_on_rank_zero(lambda: self.save(LAST_CHECKPOINT), f"writing {LAST_CHECKPOINT} at step {self.step}")
                self.saved_step = self.step
                self.window_start += time.perf_counter() - saving  # the write is not training: keep it out of tokens/s
        bar.close()
        return True

    def end_epoch(self) -> None:
        """Validate, checkpoint, apply the stopping rule, move to the next epoch. The epoch counts
        as done only after its validation: a run interrupted while validating saves the epoch with
        every batch consumed, and its resume validates it then."""
        self._check_weights(f"validating epoch {self.epoch + 1} and writing its checkpoints")
        metrics = {"event": "valid", "epoch": self.epoch + 1, "step": self.step, **self.validate()}
        self._stop_together()  # an interrupt while validating: the epoch is not done, as in one process
        # the epoch's record, stopping rule and checkpoints, all or none: an interrupt among them
        # left best.pt behind the state's best, or an epoch counted whose record was lost
        with deferred():
            self.epoch += 1
            self.consumed = 0
            self.history.append(metrics)
            improved = self.update_stopping(metrics)
            self.best_behind = None if improved else self.best_behind  # best.pt is saved below
            self._write_on_rank_zero(lambda: self._write_epoch(metrics, improved),
                                    f"writing the record and checkpoints of epoch {self.epoch}")
            self.saved_step = self.step
        log.info(
            "epoch %d: val loss %.4f/token (%.2f per 100 tokens)%s",
            self.epoch, metrics["val_loss"], metrics["val_loss_per_100_tokens"],
            (f", val BLEU {metrics['val_bleu']:.2f}" if "val_bleu" in metrics else "")
            + (f", {paper_label(self.cfg.data.lowercase)} {metrics['val_paper_bleu']:.2f}" if "val_paper_bleu" in metrics else ""),
        )

    def _write_epoch(self, metrics: dict, improved: bool) -> None:
        """Rank 0's files at an epoch's end: its record, best.pt if ``improved``, the epoch's own
        checkpoint (train.keep_checkpoints), and last.pt last. last.pt is what a resume continues
        from, so it is written once the files it counts as done are there: written before best.pt,
        a run killed between the two (``kill -9``, a lost machine) resumed from a last.pt whose best
        was that epoch's, and best.pt kept an older epoch for good (a later epoch replaced it only if
        it beat the lost one; a run killed in its last epoch trained nothing more). Killed before
        last.pt, the resume trains the epoch again and writes the same files."""
        self.log_metrics(metrics)
        if improved:
            self.save(BEST_CHECKPOINT)
        if self.tc.keep_checkpoints:
            self.save(epoch_checkpoint_name(self.epoch))
            # every older one, not just the one N epochs back: a resume with a smaller N left
            # the epochs between behind. Later epochs' files (a resume from an older checkpoint
            # copied over last.pt) are not counted: counted, they pruned the epoch just written
            if self.dist.is_main:
                for path in epoch_checkpoints(self.save_dir, up_to=self.epoch)[: -self.tc.keep_checkpoints]:
                    path.unlink()
        self.save(LAST_CHECKPOINT)

    def end_at_max_steps(self) -> None:
        """train.max_steps stopped the run inside an epoch: validate there (a record of its own,
        ``valid_mid_epoch``, outside the epochs' history and the stopping rule) and keep best.pt if
        the model beats the best so far, then save last.pt. A run whose max_steps came before its
        first epoch's end had no validation and no best.pt, so `evaluate --checkpoint best.pt` had
        nothing to read. A resume at the same step does not validate again, nor does a max_steps
        reached at an epoch's end, whose validation is the epoch's (it was validated twice, the second
        time as a ``valid_mid_epoch`` of the next epoch, of which it had trained nothing)."""
        at_epoch_end = bool(self.history) and self.history[-1]["step"] == self.step
        self._check_weights(f"writing {LAST_CHECKPOINT} at train.max_steps")
        if self.validated_step != self.step and not at_epoch_end:
            metrics = {"event": "valid_mid_epoch", "epoch": self.epoch + 1, "step": self.step, **self.validate()}
            self._stop_together()
            with deferred():
                self.validated_step = self.step
                self.mid_epoch.append(metrics)
                improved = self._update_best(metrics)
                self.best_behind = None if improved else self.best_behind  # best.pt is saved below
                self._write_on_rank_zero(lambda: self._write_mid_epoch(metrics, improved),
                                        f"writing the record and checkpoints of step {self.step}")
                self.saved_step = self.step
            log.info("max_steps %d reached inside epoch %d: val loss %.4f/token%s", self.step, self.epoch + 1,
                     metrics["val_loss"], f", val BLEU {metrics['val_bleu']:.2f}" if "val_bleu" in metrics else "")
        else:
            self._write_on_rank_zero(lambda: self.save(LAST_CHECKPOINT), f"writing {LAST_CHECKPOINT} at step {self.step}")
            self.saved_step = self.step

    def _write_mid_epoch(self, metrics: dict, improved: bool) -> None:
        """Rank 0's files at max_steps inside an epoch: the validation's record, best.pt if ``improved``,
        and last.pt last (as :meth:`_write_epoch`)."""
        self.log_metrics(metrics)
        if improved:
            self.save(BEST_CHECKPOINT)
        self.save(LAST_CHECKPOINT)

    def improves(self, m: dict) -> bool:
        """Whether validation metrics ``m`` beat the best so far (BLEU under bleu_patience, else the loss)."""
        if self.tc.stopping == "bleu_patience":
            if "val_bleu" not in m:
                raise ValueError("train.stopping=bleu_patience needs train.valid_bleu=true")
            return self.best is None or m["val_bleu"] > self.best
        # a NaN best (an fp16 validation that overflowed) is beaten by any number: `loss < NaN` is False
        return self.best is None or m["val_loss"] < self.best or (math.isnan(self.best) and not math.isnan(m["val_loss"]))

    def _update_best(self, m: dict) -> bool:
        """A validation outside the stopping rule (``valid_mid_epoch``): take ``m`` as the best if it
        beats it; whether it did."""
        improved = self.improves(m)
        if improved:
            self.best = m["val_bleu" if self.tc.stopping == "bleu_patience" else "val_loss"]
        return improved

    def update_stopping(self, m: dict) -> bool:
        """Return True if this epoch is the best so far; set self.finished when the rule fires."""
        if self.tc.stopping == "bleu_patience":
            improved = self.improves(m)
            self.best = m["val_bleu"] if improved else self.best
            self.stale = 0 if improved else self.stale + 1
            self.finished = self.stale >= self.tc.patience
            return improved
        prev = self.history[-2]["val_loss"] if len(self.history) > 1 else None
        improved = self.improves(m)
        self.best = m["val_loss"] if improved else self.best
        if self.tc.stopping == "loss_rise":
            # a NaN loss (a diverged model, whose NaN weights stay NaN) is a rise: `NaN > prev` is
            # False, so it reset the count and the run trained on to max_epochs
            rose = prev is not None and (math.isnan(m["val_loss"]) or m["val_loss"] > prev)
            self.stale = self.stale + 1 if rose else 0
            self.finished = self.stale >= self.tc.loss_rise_epochs
        return improved

    # -- validation ----------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict:
        self.model.eval()
        total, tokens = self.validation_loss()
        out = {"val_loss": total / tokens, "val_loss_per_100_tokens": 100.0 * total / tokens}
        if self.tc.valid_bleu:
            out.update(self.validation_bleu())
        if self.tc.attention_plots and self.dist.is_main:
            self._plot_or_warn()
        return out

    def validation_loss(self) -> tuple[float, int]:
        """The validation set's summed loss (no label smoothing) and its target tokens. Under DDP each
        rank computes the sums of every world_size-th of the batches one process computes (rank r
        those r, r + N, ...: the batches are sorted by length, so the shares take alike), and the
        ranks gather them: every rank adds the same numbers in rank order (Python floats, float64),
        so all take the same stopping and best.pt decisions on a loss equal to one process's to
        float tolerance; a rank left without a batch (fewer batches than ranks) sends zeros. Every
        rank computed the whole set before: N ranks did N times one process's work. A rank whose
        share fails (out of memory on a long batch) sends its error in the gather and every rank
        stops at once with it ("rank 1 failed computing its share of the validation loss: ..."),
        rather than the others failing in their next collective with gloo's "Connection closed by
        peer". The model is in eval mode: batch norm reads its running statistics, records nothing."""
        d = self.valid_data
        batches = make_batches([len(s) for s in d.src_ids], [len(t) for t in d.tgt_ids],
                               max_tokens=self.tc.batch_tokens, shuffle=False)

        def share() -> tuple[float, int]:  # this rank's batches' summed loss and target tokens
            # summed on the device in float64, read back once: the same additions as Python floats,
            # without a host sync a batch that kept the GPU waiting for the next batch's launch
            total, tokens = torch.zeros((), dtype=torch.float64, device=self.device), 0
            for idx in batches[self.dist.rank :: self.dist.world_size]:
                batch = collate([d.src_ids[i] for i in idx], [d.tgt_ids[i] for i in idx], idx).to(self.device)
                with self.autocast():
                    logits = self.model(batch.src, batch.src_pad_mask, batch.tgt_in)  # B,T,V
                total += token_loss(logits, batch.tgt_out, 0.0).double()
                tokens += batch.n_tgt_tokens
            return float(total), tokens

        shares = gather_results(share, self.dist, "computing its share of the validation loss")
        return sum(total for total, _ in shares), sum(tokens for _, tokens in shares)

    def _plot_or_warn(self) -> None:
        """Rank 0's attention plots (:meth:`plot_validation_attention`); one that fails is logged as a
        warning and training goes on: the plots are for watching, the run does not need them. Under
        DDP, raised on rank 0 alone, the error stopped rank 0 and left the others to fail in their
        next collective with gloo's "Connection closed by peer"; a single process is treated the same."""
        try:
            self.plot_validation_attention()
        except Exception as exc:  # a full disk, matplotlib missing or broken, a decoding error
            log.warning("train.attention_plots: the attention plots of step %d failed (%s: %s); training goes on "
                        "without them", self.step, type(exc).__name__, exc)

    def plot_validation_attention(self) -> None:
        """``train.attention_plots``: heatmaps of the first N validation sentences' attention (last
        decoder layer, heads averaged) on the model's greedy translations, so one can watch the
        alignment form epoch by epoch: save_dir/attention/epoch_EEE_line_NNNN.png."""
        from cometnmt.plots import plot_attention

        n = min(self.tc.attention_plots, len(self.valid_data))
        folder = self.save_dir / "attention"
        folder.mkdir(parents=True, exist_ok=True)
        for i, amap in enumerate(self._greedy_translator().attention_ids(self.valid_data.src_ids[:n]), 1):
            plot_attention(amap, folder / f"epoch_{self.epoch + 1:03d}_line_{i:04d}.png",
                           f"validation line {i}, epoch {self.epoch + 1}; last decoder layer, heads averaged")

    def _greedy_translator(self) -> Translator:
        """The model in training, as a Translator whose search is greedy (validation's): one
        hypothesis, since greedy search of decode.nbest above 1 is a beam search."""
        greedy = dataclasses.replace(self.cfg.decode, method="greedy", nbest=1)
        return Translator(self.model, self.codec, dataclasses.replace(self.cfg, decode=greedy), self.device)

    def validation_bleu(self) -> dict:
        """Greedy translations of the validation sources and their scores. Under DDP each rank
        decodes every world_size-th of the batches one process decodes (the same batches, so the
        same translations; every rank decoded them all before), the ranks gather them in input
        order and rank 0 scores them and sends the scores (or its error) to the others, so every rank
        takes the same stopping and best-checkpoint decisions. A rank whose decoding fails sends its
        error in the gather instead, and every rank stops at once with it ("rank 1 failed decoding
        its share of the validation set: ...")."""
        d = self.valid_data
        n = len(d) if self.tc.valid_bleu_max_sentences is None else min(len(d), self.tc.valid_bleu_max_sentences)

        def decode_share() -> dict[int, str]:  # {sentence index: greedy translation} of this rank's batches
            found = self._greedy_translator().translate_ids(d.src_ids[:n], shard=(self.dist.rank, self.dist.world_size))
            return {i: h[0].text for i, h in enumerate(found) if h}

        gathered: dict[int, str] = {}
        for part in gather_results(decode_share, self.dist, "decoding its share of the validation set"):
            gathered.update(part)
        hyps = [gathered[i] for i in range(n)]
        # rank 0's error too: the others stop with it rather than wait for scores that never come
        return broadcast_result(lambda: self._validation_scores(hyps, n), self.dist, "scoring the validation translations")

    def _validation_scores(self, hyps: list[str], n: int) -> dict:
        d = self.valid_data
        scores = corpus_scores(hyps, d.tgt_text[:n], lowercase=self.cfg.data.lowercase,  # a lowercased model: lowercased refs
                               lang=self.cfg.data.tgt_lang)
        out = {"val_bleu": scores["bleu"], "val_chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"],
               "val_bleu_sentences": n}  # train.valid_bleu_max_sentences may cut the set
        if self._eval_tok is not None:
            out["val_paper_bleu"] = paper_bleu(hyps, d.tgt_text[:n], self._eval_tok.tokenize)
        return out

    def summary(self) -> dict:
        return {"steps": self.step, "epochs": self.epoch, "best": self.best, "history": self.history,
                "save_dir": str(self.save_dir)}
