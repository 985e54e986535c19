"""Set up and run one training job from a Config: seeds, device, data, codec, model, trainer."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import logging
import logging.handlers
import os
import random
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from cometnmt.atomic import FolderLock, make_folder, remove_stale_temporaries, same_file
from cometnmt.config import (DATA_PATH_KEYS, Config, DataConfig, changed_keys, check_unread_files, config_from_dict,
                             max_len_keys, positions_key, to_dict, unread_multi30k_dir, unused_model_keys, yaml_dump)
from cometnmt.data.corpus import ParallelCorpus, write_text_file
from cometnmt.data.pipeline import (Examples, TextCodec, build_codec, encode_pairs, read_split, unknown_share,
                                    warn_training_pairs_in)
from cometnmt.data.tagging import attach_training_tags, check_training_tags, tag_record
from cometnmt.data.vocab import PAD
from cometnmt.errors import CheckpointError, CometNMTError, ConfigError, DataError, setting
from cometnmt.inference import resolve_device, set_cuda_backends
from cometnmt.interrupts import HandOver, deferred, ignored, noted_until_taken, raise_noted
from cometnmt.models import BUILTIN_ARCHS, build_model
from cometnmt.models.base import Seq2Seq
from cometnmt.training.checkpoint import (BEST_CHECKPOINT, CONFIG_FILE, EPOCH_CHECKPOINT, EPOCH_CHECKPOINT_GLOB,
                                         LAST_CHECKPOINT, METRICS_FILE, epoch_checkpoints, load_checkpoint,
                                         weights_misfit)
from cometnmt.training.distributed import (DistInfo, RankFailed, all_reduce_sum, any_rank, broadcast_object,
                                          broadcast_result, init_from_env, rank_error, sent, shutdown, waited_out)
from cometnmt.training.trainer import Trainer

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _resume_option(flags: bool) -> str:
    """How errors name resuming: the CLI's flag, or :func:`cometnmt.train`'s keyword."""
    return "--resume" if flags else "resume=True"


# Train keys a resumed run cannot change: the optimizer's state and the scheduler's base rate come
# from the checkpoint (a new lr, betas, eps or weight_decay was silently ignored while config.yaml
# recorded it; a new schedule or warmup would bend the old curve), and the epochs' batches, which
# the run's position points into, are made from the seed and batch sizes. The others (max_epochs,
# stopping rule (replayed over the epochs' validation records: a run the old rule ended may go on),
# clip_norm, label smoothing, accum_steps for another number of ranks, precision, device, ...) may
# change and are recorded in config.yaml.
RESUME_FIXED_TRAIN_KEYS = ("lr", "betas", "eps", "weight_decay", "schedule", "warmup_steps", "seed", "batch_tokens",
                           "batch_sentences", "bucket_width")


# Transformer++'s tagger keys (model.transformer_pp.*) -> their task: a resume may name another
# tagger (the one 'auto' resolved to in the run, say) when the checkpoint records the run's tags,
# which are then compared (_check_same_tags)
TAGGER_KEYS = {"transformer_pp.pos_tagger": "pos", "transformer_pp.ner_tagger": "ner"}
# Model keys that say where things are kept, not what is trained: a resume may change them (the tag
# cache of another machine, say: a cache file is keyed by the sentences and the annotator's name)
RESUME_FREE_MODEL_KEYS = ("transformer_pp.tag_cache_dir",)


def _lock_run_folder(lock: FolderLock, save_dir: Path) -> None:
    """Hold ``save_dir``'s lock while this process trains there (a folder not made yet: nothing).
    Two trainers in one folder (a reproduce stopped by kill -9 leaves its trainings running; rerun,
    it started a second) wrote over each other's checkpoints, or the second was refused as a run
    already there ("pass --resume"), hiding the cause."""
    if not lock.take(save_dir):
        raise ConfigError.at("train.save_dir", f"{save_dir} is in use: another process is training there (`fuser -v "
                             f"{shlex.quote(str(save_dir))}` names it); wait for it to end, or stop it (a reproduce or "
                             "compare stopped by kill -9 leaves its trainings running)")


def _check_save_dir(cfg: Config, resume: bool, flags: bool = True, lock: FolderLock | None = None) -> dict | None:
    """Never overwrite a run by accident; on --resume, return the last checkpoint. ``lock``: the
    run folder's, taken first (:func:`_lock_run_folder`; None under DDP, where rank 0 takes it)."""
    if not cfg.train.save_dir.strip():  # Path("") is the current folder: `--set train.save_dir=` trained into it
        raise ConfigError.at("train.save_dir", "empty; name a folder for the run's checkpoints and logs")
    for folder in (Path(cfg.train.save_dir), *Path(cfg.train.save_dir).parents):  # was a traceback at mkdir
        if folder.exists() and not folder.is_dir():
            within = "" if folder == Path(cfg.train.save_dir) else f" (in {cfg.train.save_dir})"
            raise ConfigError.at("train.save_dir", f"{folder}{within} is a file, not a folder; name a folder "
                                 "for the run's checkpoints and logs")
    if lock is not None:
        _lock_run_folder(lock, Path(cfg.train.save_dir))
    last = Path(cfg.train.save_dir) / LAST_CHECKPOINT
    option = _resume_option(flags)
    if resume:
        if not last.exists():
            raise CheckpointError(f"{option}: no checkpoint at {last} (train.save_dir={cfg.train.save_dir})"
                                  f"{_resume_alternatives(last, flags)}")
        try:
            payload = load_checkpoint(last)
        except CheckpointError as exc:
            raise CheckpointError(f"{option}: {exc}{_resume_alternatives(last, flags)}") from None
        saved = config_from_dict(payload["config"])
        changed = [
            f"{section}.{key} ({old!r} in the run, {new!r} now)"
            for section in ("model", "data")
            for key, old, new in changed_keys(to_dict(getattr(saved, section)), to_dict(getattr(cfg, section)))
            if not (section == "data" and key in DATA_PATH_KEYS and _same_path(old, new, payload.get("workdir")))
            and not (section == "model" and key in TAGGER_KEYS and TAGGER_KEYS[key] in payload.get("tags", {}))
            and not (section == "model" and key in RESUME_FREE_MODEL_KEYS)
        ]
        if changed:
            raise ConfigError(f"{option}: the config differs from the run in {last} in {', '.join(changed)}; "
                              "resume with the same model and data config")
        saved_train, train = to_dict(saved.train), to_dict(cfg.train)
        changed = [f"train.{key} ({saved_train[key]!r} in the run, {train[key]!r} now)"
                   for key in RESUME_FIXED_TRAIN_KEYS if saved_train[key] != train[key]]
        if changed:
            restart = "--init-from" if flags else "init_from"
            raise ConfigError(f"{option}: the config differs from the run in {last} in {', '.join(changed)}; the "
                              "optimizer, its schedule and the order of the epochs' batches continue from the "
                              f"checkpoint, so these keys must keep the run's values (to change them, start a new "
                              f"run from its weights with {restart})")
        missing = Trainer.missing_state(payload)
        if missing:  # an averaged checkpoint copied there: Trainer.load_state_dict failed with KeyError: 'optimizer'
            averaged = payload.get("averaged_from")
            what = (f"an average of {len(averaged)} checkpoints (cometnmt average), which keeps the weights alone"
                    if isinstance(averaged, list) else "not a checkpoint the trainer wrote")
            raise CheckpointError(f"{option}: {last}: it is {what}: it lacks the training state a resume continues "
                                  f"({', '.join(missing)}); {setting('init_from', last, flags)} starts a new run (in another "
                                  f"train.save_dir) from its weights{_resume_alternatives(last, flags)}")
        return payload
    save_dir = Path(cfg.train.save_dir)
    found = [p.name for p in (last, save_dir / BEST_CHECKPOINT, save_dir / METRICS_FILE) if p.exists()]
    found += sorted(p.name for p in save_dir.glob(EPOCH_CHECKPOINT_GLOB))
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        hint = (f"pass {option} to continue it" if last.exists()
                else f"it has no {LAST_CHECKPOINT} to resume from ({shown} would be mixed with the new run's)")
        raise ConfigError(
            f"train.save_dir={cfg.train.save_dir} already holds a run ({shown}); {hint}; "
            "set train.save_dir to a new folder, or move the old run away"
        )
    return None


def _resume_alternatives(last: Path, flags: bool) -> str:
    """For a resume whose ``last`` is missing or unreadable (truncated, zero bytes): the run folder's
    other checkpoints that load, newest first, and how to continue from one: each epoch checkpoint
    (train.keep_checkpoints) and best.pt holds the run's whole state at its step, so a resume from
    it continues exactly, training the steps after it again. Said, not done: a resume that fell
    back by itself would drop the training after that step (and overwrite last.pt) unasked, and
    the user may rather repair or fetch last.pt. "" when there is none."""
    found = []
    for path in (*reversed(epoch_checkpoints(last.parent)), last.parent / BEST_CHECKPOINT):
        if not path.is_file():
            continue
        try:
            payload = load_checkpoint(path, mmap=True)  # its step: the weights are not read
        except CheckpointError:
            continue
        if Trainer.missing_state(payload):  # no resume continues it
            continue
        found.append((payload["step"], payload["epoch"], path))
    if not found:
        return ""
    found.sort(key=lambda f: -f[0])  # stable: of one step, the epoch checkpoint before best.pt
    shown = ", ".join(f"{p.name} (step {step}, {epoch} epoch{'s' * (epoch != 1)} done)" for step, epoch, p in found)
    again = "run the same command again with --resume" if flags else "call train again with resume=True"
    return (f"; the run folder holds {'a checkpoint' if len(found) == 1 else 'checkpoints'} that load{'s' * (len(found) == 1)}: "
            f"{shown}; each holds the run's whole state at its step: to continue from {found[0][2].name}, copy it "
            f"over {LAST_CHECKPOINT} ({shlex.join(['cp', str(found[0][2]), str(last)])}) and {again} (the steps after it are "
            "trained again)")


def _is_run_file(name: str) -> bool:
    """Whether ``name`` is one of the files the training writes in a run folder through atomic_write
    (temporary files of others, reproduce's test.hyp say, are not the training's to remove), by
    the names the trainer and checkpoint module write them under: a renamed file is not missed."""
    return name in (LAST_CHECKPOINT, BEST_CHECKPOINT, METRICS_FILE, CONFIG_FILE) or bool(EPOCH_CHECKPOINT.fullmatch(name))


def _remove_stale_temporaries(save_dir: Path) -> None:
    """Rank 0, as a run starts or resumes: remove the temporary files of the run's checkpoints and
    logs that a process killed inside their write left in ``save_dir`` (one per kill, each as large
    as a checkpoint), not those another live process holds (see
    :func:`cometnmt.atomic.remove_stale_temporaries`)."""
    found = remove_stale_temporaries(save_dir, _is_run_file)
    if found["removed"]:
        log.info("%s: removed %d temporary file(s) a killed run left: %s", save_dir, len(found["removed"]),
                 ", ".join(p.name for p in found["removed"]))
    if found["in_use"]:
        log.warning("%s: another process is writing %s in this run folder (is this run being trained twice?)",
                    save_dir, ", ".join(p.name for p in found["in_use"]))
    if found["unknown"]:
        log.warning("%s: kept %s, temporary file(s) of an earlier write: this file system takes no lock to tell "
                    "whether a process still writes them; remove them if none does", save_dir,
                    ", ".join(p.name for p in found["unknown"]))


def _same_path(old: str | None, new: str | None, workdir: str | None) -> bool:
    """Whether a data path key of a run (relative ones taken from ``workdir``, the folder it was
    trained in) and of its resume (from this folder) name one file or folder: an absolute path
    given again as a relative one, or through a link, is no change (it was refused as one). The
    files' sentences are compared anyway (the split digests)."""
    if old is None or new is None:
        return False

    def anchored(path: str, folder: str) -> Path:
        path = Path(path).expanduser()
        return path if path.is_absolute() else Path(folder) / path

    return same_file(anchored(old, workdir or os.getcwd()), anchored(new, os.getcwd()))


def corpus_digest(corpus) -> str:
    """SHA-256 of a split's sentence pairs as read (after data.max_*_pairs; empty pairs skipped)."""
    h = hashlib.sha256()
    for src, tgt in zip(corpus.src, corpus.tgt):
        h.update(src.encode("utf-8") + b"\t" + tgt.encode("utf-8") + b"\n")
    return h.hexdigest()


def _check_same_data(payload: dict, digests: dict[str, str], corpora: dict, last: Path, flags: bool = True) -> None:
    """--resume continues exactly only on the sentences the run started with: a split whose text
    changed since (the files, not the config) is an error naming its files. Checkpoints written
    before digests were recorded are not checked."""
    for split, digest in digests.items():
        old = payload.get("data_digests", {}).get(split)
        if old is not None and old != digest:
            c = corpora[split]
            raise DataError(f"{_resume_option(flags)}: {c.src_path} / {c.tgt_path}: the {split} sentences differ from "
                            f"those the run in {last} was trained on, so it would not continue exactly; restore those "
                            f"files, or start a new run in another train.save_dir ({setting('init_from', last, flags)} "
                            "starts it from these weights)")


def _check_same_tags(payload: dict, record: dict[str, dict[str, str]], last: Path, flags: bool = True) -> None:
    """--resume continues exactly only on the tags the run was trained on: a task whose tags differ
    (``auto`` resolved to another pipeline on this machine, another version of it) is an error
    naming both taggers. Checkpoints written before the tags were recorded are not checked."""
    for task, old in payload.get("tags", {}).items():
        new = record.get(task)
        if new is not None and new["digest"] != old["digest"]:
            key = f"model.transformer_pp.{task}_tagger"
            raise DataError(f"{_resume_option(flags)}: the {task.upper()} tags of the training sentences differ from those "
                            f"the run in {last} was trained on (tagged by {old['tagger']}; now by {new['tagger']}), so it "
                            f"would not continue exactly; install the run's tagger and name it with {key}, or start a new "
                            f"run in another train.save_dir ({setting('init_from', last, flags)} starts it from these weights)")


# data keys the vocabularies and tokenizers were built with: a run started from another's weights
# keeps that run's codec, so its config must say the same
CODEC_KEYS = ("src_lang", "tgt_lang", "tokenizer", "lowercase", "min_freq", "max_vocab", "sp_vocab_size", "sp_model_type",
              "src_sos_eos")


def _load_init(cfg: Config, init_from: str | Path, flags: bool = True) -> tuple[dict, Seq2Seq]:
    """The checkpoint a new run starts from (``--init-from``) and the config's model with its
    weights: its codec is used, so the config's codec keys must equal the checkpoint's; model keys
    may differ only where the weights still fit (dropout, say). Both are checked before any data
    is read or anything written."""
    option = setting("init_from", init_from, flags)  # --init-from PATH, or init_from=PATH from cometnmt.train
    payload = load_checkpoint(init_from)
    saved = config_from_dict(payload["config"])
    changed = [f"data.{key} ({getattr(saved.data, key)!r} in the checkpoint, {getattr(cfg.data, key)!r} now)"
               for key in CODEC_KEYS if getattr(saved.data, key) != getattr(cfg.data, key)]
    if changed:
        raise ConfigError(f"{option}: the vocabularies and tokenizers come from the checkpoint, but the "
                          f"config differs from it in {', '.join(changed)}; set them as the checkpoint has them")
    changed = [f"model.{key} ({old!r} -> {new!r})" for key, old, new in changed_keys(to_dict(saved.model), to_dict(cfg.model))]
    if cfg.model.tie_embeddings and not saved.model.tie_embeddings:
        # both trained matrices would load into the one shared tensor, the output projection's last
        raise ConfigError(f"{option}: config key 'model.tie_embeddings': true, but the checkpoint was trained with separate "
                          f"target embeddings and output projection, which cannot become one matrix without losing one "
                          f"of them; set model.tie_embeddings: false (a tied checkpoint may be fine-tuned untied)",
                          keys=("model.tie_embeddings",))
    codec = TextCodec.from_state(payload["codec"])
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        raise ConfigError(f"{option}: its weights do not fit this model ({weights_misfit(exc)}); the config's "
                          f"model differs from the checkpoint's in {', '.join(changed) or 'no key (another code version?)'}"
                          ) from None
    if changed:
        log.info("--init-from: model keys changed from the checkpoint's: %s", ", ".join(changed))
    for key in ("bn_length_bounds", "decoder_bn_length_bounds"):
        old, new = getattr(saved.model.comet, key), getattr(cfg.model.comet, key)
        if cfg.model.arch == "comet" and old and new and old != new:  # the same number of rows loaded, other lengths
            log.warning("--init-from: model.comet.%s %s differs from the checkpoint's %s: each bucket starts from the "
                        "batch-norm statistics of the checkpoint's bucket of the same index, trained on other lengths, "
                        "until training moves them", key, new, old)
    return payload, model


def training_examples(cfg: Config, corpus, codec: TextCodec | None = None):
    """The training side as the trainer sees it: ``corpus`` encoded with ``codec`` (built from the
    corpus when None), over-long pairs dropped at ``data.max_len``, Transformer++'s POS/NER tags
    attached (a no-op for other models). Returns (codec, examples)."""
    if codec is None:
        codec, src_tokens, tgt_tokens = build_codec(cfg.data, corpus)
        data = encode_pairs(codec, corpus, cfg.data.max_len, (src_tokens, tgt_tokens))
    else:
        data = encode_pairs(codec, corpus, cfg.data.max_len)
    attach_training_tags(cfg, codec, data)
    return codec, data


def check_positions(cfg: Config, limit: int | None, valid_corpus, valid_data) -> None:
    """Before any training: every training pair (at most ``data.max_len`` tokens a side, plus the
    source's <s> </s> with ``data.src_sos_eos`` and the target's BOS) and every validation pair
    must fit the model's position tables; the run would otherwise fail at its first validation."""
    if limit is None:  # the RNN has no position table
        return
    src_extra = 2 if cfg.data.src_sos_eos else 0
    if cfg.data.max_len + max(src_extra, 1) > limit:
        raise ConfigError(f"config key 'data.max_len': {cfg.data.max_len} tokens (+{max(src_extra, 1)} for "
                          f"{'<s> </s> around sources' if src_extra else 'the target BOS'}) exceed the model's {limit} "
                          f"positions ({positions_key(cfg.model)}); lower data.max_len or raise the positions",
                          keys=max_len_keys(cfg))
    for i, (src, tgt) in enumerate(zip(valid_data.src_ids, valid_data.tgt_ids)):
        if len(src) > limit or len(tgt) + 1 > limit:
            path = valid_corpus.src_path if len(src) > limit else valid_corpus.tgt_path
            raise DataError(f"{path}:{i + 1}: {max(len(src), len(tgt) + 1)} positions, more than the model's {limit} "
                            f"({positions_key(cfg.model)}); shorten the validation sentence or raise the positions")


def has_test_split(data) -> bool:
    """Whether the data config names a test pair (Multi30k's always; files only with data.test_src/_tgt)."""
    return data.corpus != "files" or data.test_src is not None


def check_test_positions(cfg: Config, limit: int | None, test_corpus, codec: TextCodec) -> None:
    """Before any training: every test source must fit the model's positions, as
    ``cometnmt evaluate --split test`` requires after training (the references need not)."""
    if limit is None:
        return
    # only sentences that could be too long are tokenised: a token (a word, or a piece other than a
    # lone word-start mark) takes at least one character, and lowercasing rarely lengthens a word
    lines = [i for i, text in enumerate(test_corpus.src) if 2 * len(text) + 4 > limit]
    for i, tokens in zip(lines, codec.src_tok.tokenize_many([test_corpus.src[i] for i in lines])):
        if len(ids := codec.encode_src(tokens)) > limit:
            raise DataError(f"{test_corpus.src_path}:{i + 1}: {len(ids)} positions, more than the model's {limit} "
                            f"({positions_key(cfg.model)}); shorten the test sentence or raise the positions")


def _log_file(path: Path) -> logging.Handler:
    """A handler on the root logger that also writes the log lines to ``path`` (appending, so a
    resumed run keeps the lines of its earlier parts)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


@contextlib.contextmanager
def _held_log_lines():
    """The log lines of the block, held in memory (they reach the console as ever) to be written to
    the run's train.log once it is opened: :func:`read_splits` runs before the run folder is made,
    and its warnings (empty pairs skipped, a corpus cut by data.max_train_pairs) belong to the run.
    Yields the holder; ``holder.flush_to(handler)`` writes them there."""
    holder = logging.handlers.MemoryHandler(capacity=1 << 30, flushLevel=logging.CRITICAL + 1)  # flushed by us alone
    logging.getLogger().addHandler(holder)
    try:
        yield holder
    finally:
        logging.getLogger().removeHandler(holder)


def _write_held(holder: logging.handlers.MemoryHandler, handler: logging.Handler) -> None:
    """Write the lines ``holder`` (:func:`_held_log_lines`) kept to ``handler``, and let them go."""
    holder.setTarget(handler)
    holder.flush()
    holder.close()


def _log_failure(handler: logging.Handler, exc: Exception) -> None:
    """Write the error that stopped a run to its ``train.log`` only (the console gets it once, from
    the CLI or the caller): the message of a usage error, the traceback of anything else; for
    another rank's error (:class:`RankFailed`) the traceback that rank sent, not this rank's, the
    collective's, which says nothing."""
    record = logging.makeLogRecord({
        "name": log.name, "levelno": logging.ERROR, "levelname": "ERROR", "msg": "the run stopped: %s", "args": (exc,),
        "exc_info": None if isinstance(exc, (CometNMTError, RankFailed)) else (type(exc), exc, exc.__traceback__),
        "exc_text": exc.trace.rstrip("\n") if isinstance(exc, RankFailed) else None,  # Formatter adds it below the message
    })
    handler.handle(record)


@dataclass
class PreparedData:
    """What :func:`prepare_data` makes of a run's data: the corpora, their digests, the codec and
    the encoded (and, for Transformer++, tagged) training and validation examples."""

    train_corpus: ParallelCorpus
    valid_corpus: ParallelCorpus
    test_corpus: ParallelCorpus | None
    digests: dict[str, str]
    codec: TextCodec
    train_data: Examples
    valid_data: Examples
    tags: dict[str, dict[str, str]]

    def shareable(self) -> "PreparedData":
        """A copy to pickle for the other ranks: the codec as its state (tokenizers hold spaCy or
        SentencePiece objects), as a checkpoint keeps it."""
        return dataclasses.replace(self, codec=self.codec.state_dict())

    def received(self) -> "PreparedData":
        """The copy :meth:`shareable` made, with its codec restored."""
        return dataclasses.replace(self, codec=TextCodec.from_state(self.codec))


Splits = tuple[ParallelCorpus, ParallelCorpus, ParallelCorpus | None]  # train, valid, test (None: no test pair)


def read_splits(cfg: Config) -> Splits:
    """Read the training, validation and test splits, with every check of their files (found,
    readable, text, the same number of lines a side, no empty evaluation line, a pair at least in
    each). ``train`` calls it before it makes ``train.save_dir`` or its train.log: a run whose data
    file was missing, bad or empty left an empty run folder behind, holding a train.log with the
    error alone."""
    train_corpus = read_split(cfg.data, "train")
    valid_corpus = read_split(cfg.data, "valid")
    # the test pair is scored only after training (cometnmt evaluate --split test), but a missing
    # file, a folder, a line-count mismatch, an empty line or an empty file there is known now
    test_corpus = read_split(cfg.data, "test") if has_test_split(cfg.data) else None
    for name, corpus, key in (("training", train_corpus, "max_train_pairs"), ("validation", valid_corpus,
                              "max_valid_pairs"), ("test", test_corpus, None)):
        if corpus is not None and not len(corpus):
            raise DataError(f"{corpus.src_path}: no {name} pairs ({_why_no_pairs(corpus, key, cfg.data)})")
    for split, corpus in (("validation", valid_corpus), ("test", test_corpus)):
        if corpus is not None:
            warn_training_pairs_in(train_corpus, corpus, split)
    return train_corpus, valid_corpus, test_corpus


def _why_no_pairs(corpus: ParallelCorpus, key: str | None, data: DataConfig) -> str:
    """Why a split read no pair: its limit key at 0, every line pair empty on a side (training
    skips them; the other splits refuse the first), or an empty file."""
    if key is not None and getattr(data, key) == 0:
        return f"data.{key}=0"
    if corpus.skipped:
        return f"all {corpus.skipped} line pairs are empty or whitespace-only on a side"
    # evaluate --split test met the test pair's as "the reference set is empty", naming no file
    return "an empty file" + ("; evaluate --split test would have nothing to score" if key is None else "")


def prepare_data(cfg: Config, splits: Splits, payload: dict | None, source: dict | None, flags: bool) -> PreparedData:
    """Build the codec of the splits :func:`read_splits` read (or take ``source``'s: the checkpoint
    resumed or started from), encode and tag the training split (:func:`training_examples`) and
    encode the validation split; on a resume (``payload``), refuse changed data or tags."""
    train_corpus, valid_corpus, test_corpus = splits
    corpora = {"train": train_corpus, "valid": valid_corpus}
    digests = {split: corpus_digest(c) for split, c in corpora.items()}
    if payload is not None:
        _check_same_data(payload, digests, corpora, Path(cfg.train.save_dir) / LAST_CHECKPOINT, flags)
    codec = None if source is None else TextCodec.from_state(source["codec"])
    codec, train_data = training_examples(cfg, train_corpus, codec)
    tags = tag_record(train_data)
    if payload is not None:
        _check_same_tags(payload, tags, Path(cfg.train.save_dir) / LAST_CHECKPOINT, flags)
    valid_data = encode_pairs(codec, valid_corpus, None)
    return PreparedData(train_corpus, valid_corpus, test_corpus, digests, codec, train_data, valid_data, tags)


def _prepare_once(dist: DistInfo, setup: "_SetUp", prepare: Callable[[], PreparedData],
                  timeout_minutes: float = 30.0, set_up_failure: tuple[Exception, str] | None = None,
                  started: float | None = None) -> PreparedData:
    """``prepare()`` on rank 0 alone under DDP; the other ranks wait and receive its result.

    Every rank prepared the data itself before: N ranks built the codec N times (tokenised the
    corpus, trained the SentencePiece models) and ran Transformer++'s tagger N times, racing to
    write the same tag cache files. Now rank 0 prepares while the others wait in an all-reduce of
    what happened: rank 0 adds 0 (done), 1 (interrupted) or ``world_size + 1`` (failed), and a rank
    interrupted before it got here adds 1 from ``_SetUp.leave`` (the same all-reduce). All done:
    rank 0 broadcasts the data. Rank 0 failed: it broadcasts its error, which every other rank
    raises as its own ("rank 0 failed preparing the data: ..."), so none waits for data that will
    never come. An interrupt anywhere: every rank stops with it, as ``_SetUp`` stops them. A
    signal to a rank while it waits here is delivered after the exchange (it then leaves through
    ``_SetUp.leave``, which meets the others at ``_SetUp.ready``).

    ``set_up_failure``: rank 0's error, and what it was doing, in setting up ``train.save_dir``
    before (the folder, its train.log, the removal of stale temporaries): rank 0 prepares nothing
    and every rank stops with it in this exchange, the others with "rank 0 failed DOING: ...".
    (Raised there, it stopped rank 0 alone, and the others failed here with gloo's "Connection
    closed by peer"; a collective of its own before this one would not meet a rank interrupted
    before it, which comes here from ``_SetUp.leave``.)

    The others wait in one collective, for at most the process group's timeout
    (``timeout_minutes``, train.distributed_timeout_minutes): a preparation that takes longer
    stops every rank with an error naming the key (:func:`_waited_too_long`). ``started``: the
    ``time.monotonic()`` at which rank 0 began to read the splits (before the run folder), which
    the others' wait includes; now where not given."""
    if not dist.enabled:
        return prepare()
    prepared, error, doing = None, None, "preparing the data"
    started = time.monotonic() if started is None else started
    if dist.is_main and set_up_failure is not None:
        error, doing = set_up_failure
    elif dist.is_main:
        try:
            prepared = prepare()
        except BaseException as exc:  # an error or an interrupt: the other ranks learn of it below
            error = exc
    failure = dist.world_size + 1  # more than every rank's interrupt together
    with deferred():  # signals while waiting or exchanging: delivered once every rank is past the exchange
        code = 0 if error is None else 1 if isinstance(error, KeyboardInterrupt) else failure
        try:
            total = int(all_reduce_sum(torch.tensor(float(code), device=setup.device), dist).item())
        except RuntimeError as exc:  # gloo's and NCCL's errors, a timeout among them
            if error is not None:  # rank 0's own error says more
                raise error from exc
            _waited_too_long(dist, time.monotonic() - started, timeout_minutes, exc)
            raise
        failed, interrupted = total >= failure, total % failure
        if failed or interrupted:
            setup.met = True  # the ranks met here; none meets the others again on its way out
        if failed and not interrupted:
            kind, message, trace, keys, doing = broadcast_object(None if error is None else (*sent(error), doing), dist)
        elif not failed and not interrupted:
            shared = broadcast_object(prepared.shareable() if dist.is_main else None, dist)
    if error is not None:
        raise error
    if interrupted:
        log.warning("rank %d: another rank was interrupted while rank 0 prepared the data; every rank stops", dist.rank)
        raise KeyboardInterrupt
    if failed:
        raise rank_error(0, kind, message, trace, doing, keys)
    return prepared if dist.is_main else shared.received()


def _waited_too_long(dist: DistInfo, seconds: float, timeout_minutes: float, exc: RuntimeError) -> None:
    """After the wait for rank 0's data failed with ``exc``, ``seconds`` after the preparation began:
    if that is the process group's timeout (train.distributed_timeout_minutes), raise an error
    naming the key (on rank 0: its preparation outlasted it, and the other ranks gave up; on the
    others: they gave up). Another failure (a rank that died) is left to ``exc``."""
    if not waited_out(seconds, timeout_minutes):
        return
    minutes = seconds / 60
    if dist.is_main:
        what = (f"rank 0 prepared the data (read the splits, built the codec, tagged) in {minutes:.2f} minutes, longer "
                f"than the {timeout_minutes:g} minutes a rank waits for the others, so they stopped waiting")
    else:
        what = (f"rank {dist.rank} gave up waiting for rank 0 to prepare the data (read the splits, build the codec, "
                f"tag) after {timeout_minutes:g} minutes, the most a rank waits for the others")
    raise ConfigError.at("train.distributed_timeout_minutes", f"{what}; raise it for data that take longer to "
                         f"prepare ({type(exc).__name__}: {exc})") from exc


class _SetUp:
    """Under DDP, Ctrl-C or SIGTERM while the ranks set up (read the data, build the codec, tag,
    build the model, wrap it in DDP, load last.pt): every rank stops before training, together.

    A signal that reached one rank stopped it alone; the others went on into their next collective,
    where torchrun's SIGTERM cannot reach them: one in DDP's first broadcast or the first step's
    all-reduce failed with gloo's "Connection closed by peer" traceback (logged in train.log as the
    reason the run stopped), and one still joining the process group waited there until torchrun
    killed it 30 seconds later, without a word. Now the ranks meet twice before
    training, in an all-reduce of whether a rank holds an interrupt: at :meth:`ready` (after the
    model is built, before DDP's first collective), which a rank interrupted before it reaches from
    ``train``'s handler of the interrupt (:meth:`leave`) rather than leaving alone; and at
    :meth:`done` (before the trainer's loop takes the signals over), the signals between the two
    only noted. A signal while the rank joined the process group is delivered once it joined.
    After :meth:`done` signals are still only noted, until ``Trainer.fit`` has its own handlers in
    place and takes them (:meth:`hand_over`): its first step's all-reduce then stops every rank.
    (A signal there stopped its rank alone: the set-up's handlers were gone before fit's came, and
    fit's nested over the set-up's would have delivered to them, only to be noted.) In a single
    process it does nothing."""

    def __init__(self, dist: DistInfo, device: torch.device) -> None:
        self.dist, self.device = dist, device
        self.skip = ignored()  # a run started in the background ignores SIGINT: not an interrupt
        self.noting = ExitStack()
        self.met = not dist.enabled  # the ranks met at ready(): no rank leaves from there on without the others
        self.noted: list[int] = []
        self.hand: HandOver | None = None

    def ready(self) -> None:
        if not self.met:
            self.hand = self.noting.enter_context(noted_until_taken())
            self.noted = self.hand.noted
            self.met = True
            self._agree()

    def leave(self) -> None:
        """An interrupt on its way out of ``train`` before :meth:`ready`: tell the others there."""
        if not self.met:
            self.met = True
            any_rank(True, self.dist, self.device)

    def done(self) -> None:
        if self.dist.enabled:
            self._agree()

    def hand_over(self) -> HandOver | None:
        """After :meth:`done`, for ``Trainer.fit``: the set-up's signals, still noted until fit takes
        them; None in a single process."""
        return self.hand

    def close(self) -> None:
        self.noting.close()

    def _agree(self) -> None:
        mine = [signum for signum in self.noted if signum not in self.skip]
        anyone = any_rank(bool(mine), self.dist, self.device)
        if anyone:
            self.close()  # the signals are handled as before again
            raise_noted(mine)  # this rank's own, as it would have been raised
            log.warning("rank %d: another rank was interrupted while the ranks set up; every rank stops", self.dist.rank)
            raise KeyboardInterrupt


def _release_frames(tb) -> None:
    """Before the process group goes (DDP): the locals of the frames an exception passing through
    holds (an interrupt raised inside ``Trainer.fit``: its frames keep the trainer, and the trainer
    the DistributedDataParallel wrapper whose reducer holds the group) are cleared and collected, so
    that the group's gloo threads end in ``destroy_process_group`` and not at interpreter exit. A
    rank stopped by a signal aborted there now and then in the test suite with "terminate called
    without an active exception" (a C++ thread still joinable when destroyed). The frames keep their
    lines: a traceback printed later is the same. None (a clean finish): the collection alone, for a
    reference cycle that keeps the trainer (a rank once aborted so after a clean finish too, in
    test_two_ranks_equal_one_process_and_resume_in_one)."""
    if tb is not None:
        traceback.clear_frames(tb)  # the frame still executing (this finally's) is skipped
    gc.collect()


def train(cfg: Config, resume: bool = False, init_from: str | Path | None = None, flags: bool = True) -> dict:
    """Train (or continue training) the run described by ``cfg``; returns the trainer's summary.

    ``init_from``: start a new run from a trained checkpoint's weights and vocabularies (fine-tuning,
    on other data say) with a fresh optimizer, schedule and step count; ``--resume`` of such a run
    continues from its own ``last.pt``. Errors name these as the CLI's flags, or with ``flags=False``
    as the keywords (``resume=True``) of :func:`cometnmt.train`.

    Rank 0 also writes the log lines to ``train.save_dir/train.log``: those the logging
    configuration lets through (``cometnmt train`` logs at INFO; a Python caller sets its own,
    e.g. ``logging.basicConfig(level=logging.INFO)``).
    """
    if cfg.train.save_dir.startswith("~"):  # the home folder, as in the data keys (a config gets no shell)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, save_dir=os.path.expanduser(cfg.train.save_dir)))
    device = resolve_device(cfg.train.device, "train.device")
    # under DDP a signal while joining the process group is delivered once joined, in the try below
    # (_SetUp): a rank that left before joining kept the others waiting in the group's rendezvous
    with deferred(redeliver=False) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else nullcontext([]) as joining:
        dist = init_from_env(device.type, cfg.train.distributed_timeout_minutes)
    if not dist.is_main:  # rank 0 reports; the other ranks' log lines would repeat its own
        logging.getLogger("cometnmt").setLevel(logging.WARNING)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    if device.type == "cuda":
        set_cuda_backends(cfg.train.cudnn_attention)
    handler, clean, trainer, model, init_model = None, False, None, None, None
    setup = _SetUp(dist, device)
    lock = FolderLock()
    try:
        raise_noted([signum for signum in joining if signum not in setup.skip])
        if resume and init_from is not None:
            raise ConfigError(f"{'--init-from' if flags else 'init_from'} starts a new run from a checkpoint's weights; "
                              f"{_resume_option(flags)} continues the run in train.save_dir; give one of them")
        # before anything is written to the folder; under DDP rank 0 locks it below, its failure relayed
        payload = _check_save_dir(cfg, resume, flags, None if dist.enabled else lock)
        check_unread_files(cfg.data)  # file pairs that data.corpus multi30k would ignore
        check_training_tags(cfg)  # Transformer++'s tag cache and taggers: before the corpus is read and tagged
        init, init_model = (None, None) if init_from is None else _load_init(cfg, init_from, flags)
        set_up_failure = None  # under DDP rank 0's, with what it did: every rank stops with it in _prepare_once
        splits = None  # under DDP rank 0 alone reads (the others receive the prepared data)
        reading = time.monotonic()  # under DDP the others wait from about now: their timeout counts rank 0's reading
        if dist.is_main:
            save_dir = Path(cfg.train.save_dir)
            doing = f"locking the run folder {save_dir}"
            try:
                _lock_run_folder(lock, save_dir)  # held already in a single process
                doing = "reading the data"
                with _held_log_lines() as held:  # before the folder: a missing or bad file leaves no run folder
                    splits = read_splits(cfg)
                doing = f"making the run folder {save_dir}"
                make_folder(save_dir)
                _lock_run_folder(lock, save_dir)  # a new folder's
                doing = f"opening {save_dir / 'train.log'}"
                handler = _log_file(save_dir / "train.log")
                _write_held(held, handler)
                doing = f"removing the stale temporary files in {save_dir}"
                _remove_stale_temporaries(save_dir)
            except Exception as exc:  # under DDP raised in _prepare_once's exchange, on every rank
                if not dist.enabled:
                    raise
                set_up_failure = (exc, doing)
        unused = unused_model_keys(cfg.model)
        if unused:
            declared = ("" if cfg.model.arch in BUILTIN_ARCHS else
                        f", or the uses=(...) that register_architecture({cfg.model.arch!r}, ...) declares")
            log.warning("model.arch=%s does not use %s (set away from their defaults; trained without them: check "
                        "model.arch%s)", cfg.model.arch, ", ".join(unused), declared)
        if (unread := unread_multi30k_dir(cfg.data)) is not None:
            log.warning("%s", unread)
        seed_everything(cfg.train.seed)

        source = payload if payload is not None else init
        # under DDP rank 0 alone (which read the splits above) builds the codec and tags; the others receive the result
        prepared = _prepare_once(dist, setup, lambda: prepare_data(cfg, splits, payload, source, flags),
                                 cfg.train.distributed_timeout_minutes, set_up_failure, reading)
        train_corpus, valid_corpus, test_corpus = prepared.train_corpus, prepared.valid_corpus, prepared.test_corpus
        digests, codec, train_data, valid_data, tags = (prepared.digests, prepared.codec, prepared.train_data,
                                                        prepared.valid_data, prepared.tags)
        log.info("data: %d training pairs, %d validation pairs", len(train_data), len(valid_data))
        log.info("tokens %s vocabularies lack (<unk>): training %.2f%% of source, %.2f%% of target; validation %.2f%%, "
                 "%.2f%%", "the checkpoint's" if source is not None else "the", *(100 * unknown_share(ids) for ids in (
                     train_data.src_ids, train_data.tgt_ids, valid_data.src_ids, valid_data.tgt_ids)))
        if not len(train_data):
            raise DataError(f"{train_corpus.src_path}: no training pairs left of {len(train_corpus.src) + train_corpus.skipped} "
                            f"read (data.max_train_pairs={cfg.data.max_train_pairs}, data.max_len={cfg.data.max_len}; "
                            "empty pairs are skipped)")

        if init_model is not None:
            model = init_model.to(device)
            log.info("starting from the weights and vocabularies of %s", init_from)
        else:
            model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD).to(device)
        check_positions(cfg, model.position_limit(), valid_corpus, valid_data)
        if test_corpus is not None:
            check_test_positions(cfg, model.position_limit(), test_corpus, codec)
        log.info("model %s: %.2fM parameters", cfg.model.arch, model.num_parameters() / 1e6)
        setup.ready()  # under DDP: before the first collective (DDP's), every rank here or stopping (_SetUp)
        trainer = Trainer(cfg, model, codec, train_data, valid_data, device, dist)
        trainer.data_digests = digests
        trainer.tag_record = tags
        if init is not None:
            trainer.init_from = str(init_from)
        if payload is not None:
            trainer.load_state_dict(payload, Path(cfg.train.save_dir) / LAST_CHECKPOINT)
            trainer.drop_records_after_checkpoint()
            if trainer.done:
                log.info("the run had already finished at step %d, epoch %d (%s): nothing to train",
                         trainer.step, trainer.epoch, "its stopping rule" if trainer.finished else "train.max_epochs")
            else:
                log.info("resumed from step %d (epoch %d)", trainer.step, trainer.epoch + 1)
        if not trainer.done:  # on --resume too: train keys (max_epochs, say) may have changed
            config_path = Path(cfg.train.save_dir) / CONFIG_FILE  # rank 0's file; its failure stops every rank
            broadcast_result(lambda: write_text_file(config_path, yaml_dump(to_dict(cfg))), dist,
                             f"writing {config_path}")
        setup.done()
        hand = setup.hand_over()  # under DDP the signals since done(): fit's to count
        summary = trainer.fit() if hand is None else trainer.fit(hand)
        clean = True
        return summary
    except KeyboardInterrupt as exc:
        setup.leave()
        # an interrupt during a failure (interrupts.deferred raises it from the failure): the signal's
        # exit wins, but train.log says what failed, as it says for the failure alone
        if handler is not None and isinstance(exc.__cause__, Exception):
            _log_failure(handler, exc.__cause__)
        raise
    except Exception as exc:
        if handler is not None:  # train.log says why the run stopped; the caller shows the error itself
            _log_failure(handler, exc)
        raise
    finally:
        setup.close()
        lock.release()
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
        # DistributedDataParallel's reducer holds the process group: let it go first, so that the
        # group's threads end in shutdown and not whenever the last reference to the model does
        trainer = model = init_model = None  # noqa: F841
        if dist.enabled:
            _release_frames(sys.exc_info()[2])
        shutdown(dist, clean)
