"""Translate text with a model and its codec: sort by length, batch, search, restore the order."""

from __future__ import annotations

import contextvars
import functools
import logging
import numbers
import os
import re
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
from tqdm import tqdm

from cometnmt.config import (PRECISIONS, SEED_LIMIT, Config, DecodeConfig, check_decode, config_from_dict, from_dict,
                             length_penalty_problem, positions_key, temperature_problem, to_dict)
from cometnmt.data.batching import collate
from cometnmt.data.corpus import drop_byte_order_marks, nul_note, read_lines, warn_not_nfc
from cometnmt.data.pipeline import TextCodec, anchor_paths, read_split, split_files
from cometnmt.data.vocab import BOS, EOS, PAD, UNK
from cometnmt.errors import CheckpointError, ConfigError, DataError, a_type, setting
from cometnmt.decoding import precision_context, sampling_seed, search, target_log_probs
from cometnmt.interrupts import check_stop
from cometnmt.models import build_model
from cometnmt.models.base import Seq2Seq
from cometnmt.models.ensemble import Ensemble
from cometnmt.progress import progress_bar
from cometnmt.training.checkpoint import load_checkpoint, load_weights
from cometnmt.training.host_memory import keep_freed_memory

log = logging.getLogger(__name__)


def checkpoint_list(path: str | Path | Sequence[str | Path]) -> list:
    """One checkpoint, or several (an ensemble), as a list of what was given. Anything but a path
    (str or os.PathLike) or a list of them is a TypeError that says what it got: None and 5 said
    "not iterable", and bytes were taken as a list of numbers."""
    def is_path(value) -> bool:
        return isinstance(value, (str, os.PathLike))

    if is_path(path):
        return [path]
    bad = path
    if not isinstance(path, (bytes, bytearray)) and isinstance(path, Iterable):
        items = list(path)
        wrong = [p for p in items if not is_path(p)]
        if not wrong:
            return items
        bad = wrong[0]
    got = "None" if bad is None else a_type(bad) + (f" ({bad!r})" if isinstance(bad, (bytes, int, float)) else "")
    raise TypeError(f"a checkpoint is a path (str or pathlib.Path), or a list of paths for an ensemble; got {got}")


def _sentence_list(texts, name: str, method: str) -> list:
    """``texts`` (any iterable of sentences but one string) as a list; bytes or a non-iterable
    (None, 5) is a TypeError naming ``name``, not "'NoneType' object is not iterable" or, for
    bytes, "sentence 1 is an int"."""
    if isinstance(texts, (bytes, bytearray)):
        raise TypeError(f"{method}: {name} is bytes; decode it (data.decode('utf-8')) into a list of strings")
    if isinstance(texts, Mapping):  # iterating one gives its keys, silently: {"id1": "Ein Hund."} translated "id1"
        raise TypeError(f"{method}: {name} is {a_type(texts)}; give a list of sentences (list(d.values()) for its "
                        f"values, in the mapping's order)")
    if isinstance(texts, (set, frozenset)):  # no order: results could not be matched to sentences by position
        raise TypeError(f"{method}: {name} is {a_type(texts)}, which has no order; give a list of sentences")
    try:
        return list(texts)
    except TypeError:
        raise TypeError(f"{method}: {name} must be a list of sentences, got {a_type(texts)}") from None


def resolve_device(name: str, key: str = "device", flag: bool = False) -> torch.device:
    """``auto`` (a GPU when there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; a device
    this machine does not have is a :class:`ConfigError` naming ``key`` (a command line's flag
    where ``flag``: ``--device cuda``, not ``device='cuda'``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shown = f"{key} {name}" if flag else f"{key}={name!r}"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{shown} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{shown}: cometnmt runs on auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{shown}, but CUDA is not available here (torch {torch.__version__}); use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"{key}={name!r}, but this machine has {torch.cuda.device_count()} GPU(s)")
    return device


def set_cuda_backends(cudnn_attention: bool = True) -> None:
    """The CUDA settings `cometnmt train` and the bench share: TF32 matmuls and convolutions, and
    whether attention may use cuDNN's kernels (config key ``train.cudnn_attention``)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)


def decode_config(base: DecodeConfig, beam: int | None = None, nbest: int | None = None,
                  length_penalty: float | None = None, batch_sentences: int | None = None,
                  flags: bool = True, *, sampling: bool | None = None, topk: int | None = None, topp: float | None = None,
                  temperature: float | None = None, seed: int | None = None,
                  replace_unk: bool | None = None, precision: str | None = None,
                  warn: Callable[[str], None] | None = None) -> DecodeConfig:
    """``base`` with the given settings replaced (None keeps base's): ``beam`` 1 means greedy, more
    means beam search of that width; ``nbest`` above 1 implies beam search, unless sampling.
    ``sampling`` True samples (``nbest`` samples a sentence), False leaves a sampling ``base`` for
    greedy search; ``topk``, ``topp``, ``temperature`` and ``seed`` set sampling's keys and need it.
    ``replace_unk`` sets ``decode.replace_unk`` (any search), ``precision`` ``decode.precision``
    (fp32, bf16 or fp16: the search's arithmetic, :func:`~cometnmt.decoding.precision_context`). Errors name the setting as a
    command-line flag (``--beam 0``) or, with ``flags=False``, as a keyword (``beam=0``).
    ``warn`` logs a warning's text (default: every call logs it; a :class:`Translator` logs each text once)."""
    def name(option: str, value: object) -> str:
        return setting(option, value, flags)

    if not isinstance(base, DecodeConfig):
        raise TypeError(f"decode_cfg must be a cometnmt.config.DecodeConfig (or None: the checkpoint's), got {a_type(base)}")
    check_decode(base)
    beam, nbest, length_penalty, batch_sentences, topk, topp, temperature, seed = (
        plain_number(v) for v in (beam, nbest, length_penalty, batch_sentences, topk, topp, temperature, seed))
    _check_search_settings(name, beam, nbest, length_penalty, batch_sentences)
    _check_sampling_settings(name, sampling, topk, topp, temperature, seed)
    if replace_unk is not None and not isinstance(replace_unk, bool):
        raise ConfigError(f"{name('replace_unk', repr(replace_unk))}: must be true or false")
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"{name('precision', repr(precision))}: must be one of {', '.join(PRECISIONS)}")
    data = to_dict(base)
    data["method"] = _method(base.method, beam, nbest or base.nbest, sampling, name, flags)
    if beam is not None:
        data["beam_size"] = beam
    for key, value in (("nbest", nbest), ("length_penalty", length_penalty), ("batch_sentences", batch_sentences),
                       ("sampling_topk", topk), ("sampling_topp", topp), ("temperature", temperature), ("sampling_seed", seed),
                       ("replace_unk", replace_unk), ("precision", precision)):
        if value is not None:
            data[key] = value
    for option, value in (("topk", topk), ("topp", topp), ("temperature", temperature), ("seed", seed)):
        if value is not None and data["method"] != "sample":
            raise ConfigError(f"{name(option, value)}: a sampling setting; add {_sampling_flag(flags)}")
    if data["method"] == "beam" and data["nbest"] > data["beam_size"]:
        if nbest is not None:
            raise ConfigError(f"{name('nbest', data['nbest'])}: more hypotheses than the beam keeps ({data['beam_size']}); "
                              f"use {name('beam', data['nbest'])} or more")
        # the nbest is the base's (a checkpoint's decode.nbest): --beam 1 on one of nbest 3 was
        # refused as '--nbest 3: ...', a flag not given
        fix = f"give {name('nbest', 1)}, or {name('beam', data['nbest'])} or more"
        if beam is not None:
            raise ConfigError(f"{name('beam', beam)}: keeps fewer hypotheses than the default nbest, {data['nbest']} "
                              f"(decode.nbest); {fix}")
        raise ConfigError(f"sampling=False: greedy search of the default nbest, {data['nbest']} (decode.nbest), is a beam "
                          f"search, and the default beam, {data['beam_size']} (decode.beam_size), keeps fewer; {fix}")
    if length_penalty is not None and data["method"] != "beam" and length_penalty != base.length_penalty:
        (warn or _log_warning)(f"{name('length_penalty', length_penalty)}: "
                               f"{'sampling' if data['method'] == 'sample' else 'greedy search'} has no length penalty; "
                               f"it applies with a beam of 2 or more ({name('beam', 'N')})")
    return from_dict(DecodeConfig, data, "decode")


def _log_warning(text: str) -> None:
    log.warning("%s", text)


def plain_number(value):
    """A NumPy number (``np.int64`` from ``np.arange``, ``np.float32``) as the Python int or float
    it holds, so the checks take it as what it is ("beam=np.int64(2): must be an integer"); any
    other value (bools included) as it is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral, float)):
        return float(value)
    return value


def _sampling_flag(flags: bool) -> str:
    return "--sampling" if flags else "sampling=True"


def _method(method: str, beam: int | None, nbest: int, sampling: bool | None, name, flags: bool) -> str:
    """The search a call runs: ``beam`` picks greedy or beam search, ``sampling`` True sampling
    (not with ``beam``), False greedy search in place of the base's sampling; several hypotheses
    of greedy search are a beam's."""
    if sampling and beam is not None:
        raise ConfigError(f"{_sampling_flag(flags)} and {name('beam', beam)}: choose one (sampling draws each token; "
                          f"{name('nbest', 'N')} gives N samples)")
    if beam is not None:
        method = "beam" if beam > 1 else "greedy"
    if sampling is not None:
        method = "sample" if sampling else ("greedy" if method == "sample" else method)
    return "beam" if method == "greedy" and nbest > 1 else method


def _check_search_settings(name, beam, nbest, length_penalty, batch_sentences) -> None:
    for option, value in (("beam", beam), ("nbest", nbest), ("batch_size", batch_sentences)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{name(option, repr(value))}: must be an integer")
        if value is not None and value < 1:
            raise ConfigError(f"{name(option, value)}: must be at least 1")
    if length_penalty is not None and (isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float))):
        raise ConfigError(f"{name('length_penalty', repr(length_penalty))}: must be a number")
    if length_penalty is not None and (problem := length_penalty_problem(length_penalty)) is not None:
        raise ConfigError(f"{name('length_penalty', length_penalty)}: {problem}")


def check_batch_size(batch_size, flags: bool = False) -> int | None:
    """A ``batch_size`` (sentences per batch; None: the decode config's) as forced decoding and
    attention take it, checked as :func:`decode_config` checks translate's: -1 made no batches,
    so ``log_prob`` returned 0.0 for every pair and ``attention`` None for every map, and 0 was
    taken for the default. Returns it as a Python int."""
    batch_size = plain_number(batch_size)
    _check_search_settings(lambda option, value: setting(option, value, flags), None, None, None, batch_size)
    return batch_size


def _check_sampling_settings(name, sampling, topk, topp, temperature, seed) -> None:
    if sampling is not None and not isinstance(sampling, bool):
        raise ConfigError(f"{name('sampling', repr(sampling))}: must be true or false")
    for option, value in (("topk", topk), ("seed", seed)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{name(option, repr(value))}: must be an integer")
        if value is not None and value < 0:
            raise ConfigError(f"{name(option, value)}: must be at least 0{' (0: the whole vocabulary)' if option == 'topk' else ''}")
        if option == "seed" and value is not None and value >= SEED_LIMIT:
            raise ConfigError(f"{name(option, value)}: must be below 2**63")
    for option, value in (("topp", topp), ("temperature", temperature)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{name(option, repr(value))}: must be a number")
    if topp is not None and not 0 < topp <= 1:
        raise ConfigError(f"{name('topp', topp)}: must be in (0, 1] (1: off)")
    if temperature is not None and (problem := temperature_problem(temperature)) is not None:
        raise ConfigError(f"{name('temperature', temperature)}: {problem}")


@dataclass
class Translation:
    """One hypothesis: detokenised ``text``, its search ``score`` (log-probability, length-normalised
    under beam search with a length penalty; a sample's is the model's own, before temperature and
    top-k/top-p) and its target ``tokens`` (with ``decode.replace_unk``, the copied source words in
    place of ``<unk>``; the score stays the search's)."""

    text: str
    score: float
    tokens: list[str]


@dataclass
class PairScore:
    """Forced decoding of one (source, target) pair: the model's ``log_prob`` of the target (natural
    log, summed over its tokens and the closing </s>), its ``tokens`` (</s> included) and how many
    of them are ``unknown`` to the model's vocabulary (scored as <unk>)."""

    log_prob: float
    tokens: int
    unknown: int


@dataclass
class AttentionMap:
    """One sentence pair's attention of the target over the source (:meth:`Translator.attention`):
    ``weights[t][s]`` is how much target token t (``</s>`` last) attends to source token s, as the
    model sees them (subwords; ``<s>``/``</s>`` where the model wraps the source), head-averaged;
    each row sums to 1."""

    source: list[str]
    target: list[str]
    weights: list[list[float]]
    layer: int  # the decoder layer, 0-based


@dataclass(frozen=True)
class CheckedSources:
    """Source sentences checked and tokenised by :meth:`Translator.check_sources`, which
    :meth:`Translator.translate` takes in place of their text without tokenising them again: a caller
    that checks sentences before translating them (``cometnmt serve``'s batches) had each one
    tokenised twice, once by the check and again by the call. ``texts``: the sentences as the
    Translator reads them (byte order marks dropped); ``words``: their tokens; ``ids``: their
    indexes (none for a blank sentence); ``codec``: the tokenizer and vocabulary that made them (a
    Translator of another codec tokenises ``texts`` afresh). ``a + b`` holds the sentences of both,
    for one call translating them together."""

    texts: list[str]
    words: list[list[str]]
    ids: list[list[int]]
    codec: TextCodec = field(repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.texts)

    def __add__(self, other: "CheckedSources") -> "CheckedSources":
        if not isinstance(other, CheckedSources):
            return NotImplemented
        if other.codec is not self.codec:
            raise ValueError("CheckedSources of two Translators' codecs cannot be joined: their tokens and ids differ; "
                             "check each translator's sentences with its own check_sources")
        return CheckedSources(self.texts + other.texts, self.words + other.words, self.ids + other.ids, self.codec)


@dataclass
class SplitTranslation:
    """A data split's sources, references and the best hypothesis for each, line-aligned;
    ``split_pairs``: the pairs the split holds, more than ``len(src)`` where ``limit`` cut it (a
    report says "the first N sentences only" from the two, not from the limit alone: --eval-limit
    1000 on the 1,000 test sentences decoded all of them)."""

    src: list[str]
    refs: list[str]
    hyps: list[str]
    split_pairs: int | None = None


def check_split(split: str, limit: int | None = None) -> int | None:
    """A split of a model's own data and a number of its sentences, as :meth:`Translator.translate_split`
    and ``evaluate_checkpoint`` take them: a ConfigError naming the keyword (``split='dev'`` was a
    KeyError 'dev', and ``limit=-1`` dropped the last sentence, as a slice does); returns the limit
    as a Python int."""
    if split not in ("train", "valid", "test"):
        raise ConfigError(f"split={split!r}: choose train, valid or test")
    limit = plain_number(limit)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r}: a number of sentences, at least 1 (or None for all)")
    return limit


_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # what str.splitlines splits on
_SPACES = re.compile(" {2,}")


# True while the sentences given to a Translator were read by the file readers, which warned already
_READ_FROM_FILES = contextvars.ContextVar("cometnmt_read_from_files", default=False)


@contextmanager
def read_from_files() -> Iterator[None]:
    """Translator calls inside this take sentences read by ``read_lines``/``decode_lines`` (the
    commands, ``translate_split``), which warned of text not in Unicode NFC naming the file and
    line: the Translator does not warn a second time, naming only a sentence."""
    token = _READ_FROM_FILES.set(True)
    try:
        yield
    finally:
        _READ_FROM_FILES.reset(token)


def _check_sentences(texts: list, name: str = "sentences") -> list[str]:
    """Each item one sentence: a string, without a newline, encodable as UTF-8 (no lone
    surrogates, which JSON and Python strings can carry), without a NUL character (UTF-16 text
    decoded as UTF-8, :func:`~cometnmt.data.corpus.nul_note`). A carriage return inside a sentence is
    text, as in training (files are split on newlines only; spaCy and SentencePiece take it as a space,
    as any whitespace character; a SentencePiece model trained before they did keeps it as a character,
    <unk> where its training text had none).
    Returns the sentences without the byte order marks (U+FEFF) that open one, as the file readers
    drop them (``decode_lines``): a first line read with ``open(path, encoding="utf-8")`` keeps its
    mark, which made its first word another, unknown one (U+FEFF "Ein", not "Ein").
    Sentences not in Unicode NFC are kept, with one warning naming ``name`` (the method and its
    argument), how many and the first one, as the file readers warn (outside :func:`read_from_files`)."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"sentence {i + 1} is {a_type(text)}, not a string")
        if "\n" in text:
            raise DataError(f"sentence {i + 1} holds a newline; give one sentence per string")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DataError(f"sentence {i + 1}: not valid Unicode (a lone surrogate at column {exc.start + 1})") from None
        if note := nul_note(text):  # UTF-16 decoded as UTF-8: the file readers refuse it too
            raise DataError(f"sentence {i + 1} {note}")
    if not _READ_FROM_FILES.get():
        warn_not_nfc(texts, name, unit="sentence")
    return drop_byte_order_marks(texts)


def _one_call_at_a_time(method):
    """A :class:`Translator` method that runs alone: its calls from other threads wait for it."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


_WARNED_TEXTS = 1000  # how many distinct warning texts a Translator remembers having logged (_warn_once)


class Translator:
    """A model plus everything needed to turn text into text; built from a checkpoint alone.

    Example::

        translator = Translator.from_checkpoint("runs/multi30k/comet/best.pt", device="cpu")
        translator("Ein Mann fährt Fahrrad.")                     # one sentence -> its translation
        translator(["Zwei Hunde.", "Ein Kind lacht."], beam=5)     # a list -> a list
        translator.translate(["Zwei Hunde."], beam=5, nbest=3)[0]  # n-best Translation objects
        translator.translate(["Zwei Hunde."], sampling=True, topk=10, nbest=4, seed=1)[0]  # 4 samples
        translator.search_config(beam=5, nbest=3)  # the DecodeConfig such a call runs, checked; nothing translated

    Search settings not given come from the checkpoint's ``decode`` config (``self.cfg.decode``).

    Threads may share one Translator: its calls (``translate``, ``log_prob``, ``attention``, their
    ``*_ids`` forms, and what calls them) run one at a time, a lock making a call from another
    thread wait, and each gets the results it gets alone. Without the lock two calls that read
    attention weights (``attention``, ``replace_unk``), which the model keeps on its attention
    modules while a call runs, mixed up each other's weights or failed (a tensor size mismatch, an
    AttributeError). Searches do not run side by side on one model: on a CPU torch already spreads
    each over ``torch.get_num_threads()`` threads; a second model (``from_checkpoint`` again) is
    needed for that. ``cometnmt serve`` queues its requests first-come first-served before this lock.
    """

    def __init__(self, model: Seq2Seq, codec: TextCodec, cfg: Config, device: torch.device) -> None:
        self.model, self.codec, self.cfg, self.device = model.to(device).eval(), codec, cfg, device
        self.workdir: str | None = None  # the folder the model was trained in (its data paths' anchor)
        self.checkpoints: list[str] = []  # what from_checkpoint loaded, for the repr
        self._lock = threading.RLock()  # one call at a time (the class docstring); re-entered by calls within a call
        self._warned: set[str] = set()  # the search warnings logged already (_warn_once)
        self._warned_lock = threading.Lock()  # cometnmt serve checks requests' settings on their own threads
        if device.type == "cpu":
            keep_freed_memory()  # as in training: the per-step logits are re-allocated at every step

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str = "auto") -> "Translator":
        """Load ``path`` (a ``best.pt``, ``last.pt``, epoch or averaged checkpoint) onto ``device``:
        ``auto`` (a GPU when there is one), ``cpu``, ``cuda`` or ``cuda:N``.

        A list of two or more checkpoints is an ensemble (:class:`~cometnmt.models.ensemble.Ensemble`):
        their probabilities are averaged at every step. They must share the vocabularies and
        tokenizers (e.g. seeds or epochs of one config; architectures may differ); the search
        settings, data config and folder come from the first."""
        paths = checkpoint_list(path)
        if not paths:
            raise CheckpointError("no checkpoint given")
        # mapped, not read: the weights are copied into the model once, and the optimizer state that
        # best.pt keeps for a resume (3 tensors a weight under Adam) is never read
        first = load_checkpoint(paths[0], mmap=True)
        codec = TextCodec.from_state(first["codec"])
        models = []
        for i, p in enumerate(paths):
            payload = first if i == 0 else load_checkpoint(p, mmap=True)
            if payload["codec"] != first["codec"]:
                parts = {"src_tok": "source tokenizer", "tgt_tok": "target tokenizer", "src_vocab": "source vocabulary",
                         "tgt_vocab": "target vocabulary", "src_sos_eos": "<s> </s> around sources (data.src_sos_eos)"}
                differ = [name for key, name in parts.items() if payload["codec"].get(key) != first["codec"].get(key)]
                raise CheckpointError(f"{p}: its {', '.join(differ) or 'vocabularies or tokenizers'} differ"
                                      f"{'s' if len(differ) == 1 else ''} from those of {paths[0]}; an ensemble's "
                                      "models must share them (seeds or epochs of one config)")
            model = build_model(config_from_dict(payload["config"]).model, len(codec.src_vocab), len(codec.tgt_vocab), PAD)
            load_weights(model, payload["model"], p)
            models.append(model)
        model = models[0] if len(models) == 1 else Ensemble(models)
        translator = cls(model, codec, config_from_dict(first["config"]), resolve_device(device))
        translator.workdir = first.get("workdir")  # None for checkpoints written before it was recorded
        translator.checkpoints = [str(p) for p in paths]
        return translator

    def __repr__(self) -> str:
        """What a notebook shows for ``translator``: the model, languages, default search, device and
        checkpoint (the object's address alone said none of it)."""
        data, decode = self.cfg.data, self.cfg.decode
        model = (f"ensemble of {len(self.model.members)}" if isinstance(self.model, Ensemble)
                 else repr(self.cfg.model.arch))
        search = {"beam": f"beam search of {decode.beam_size}", "sample": "sampling"}.get(decode.method, f"{decode.method} search")
        params = sum(p.numel() for p in self.model.parameters()) / 1e6
        where = {0: "", 1: f", checkpoint={self.checkpoints[0]!r}"}.get(len(self.checkpoints),
                                                                          f", checkpoints={self.checkpoints!r}")
        return (f"Translator({model}, {data.src_lang}->{data.tgt_lang}, {params:.2f}M parameters, "
                f"{search}, device={str(self.device)!r}{where})")

    def _batches(self, ids: list[list[int]], size: int, among: list[int] | None = None) -> Iterator[list[int]]:
        """Places in ``ids`` (those ``among``; default all), by length, ``size`` to a batch."""
        order = sorted(range(len(ids)) if among is None else among, key=lambda i: len(ids[i]))
        for start in range(0, len(order), size):
            yield order[start : start + size]

    def search_config(self, decode_cfg: DecodeConfig | None = None, *, beam: int | None = None,
                      nbest: int | None = None, length_penalty: float | None = None, batch_size: int | None = None,
                      sampling: bool | None = None, topk: int | None = None, topp: float | None = None,
                      temperature: float | None = None, seed: int | None = None,
                      replace_unk: bool | None = None, precision: str | None = None, flags: bool = False) -> DecodeConfig:
        """The search a :meth:`translate` call given these settings runs, checked and normalised as
        that call checks them, without translating anything: ``decode_cfg`` (default the
        checkpoint's ``decode`` config) with the settings given replaced (:meth:`translate`'s
        keywords; None keeps the config's), greedy search of ``nbest`` above 1 made a beam search,
        ``sampling`` made ``method`` "sample". ``translate(texts, translator.search_config(**settings))``
        translates as ``translate(texts, **settings)``: a caller that queues work for later
        (``cometnmt serve``'s batches) checks a request's settings at once and keys batches on the
        result. ``self.cfg`` is not changed.

        :param flags: name bad settings as command-line flags (``--beam 0``, ``--replace-unk``) rather
            than keywords, for a command that passes its options on (``cometnmt serve``, ``evaluate``).
        :raises ConfigError: a bad setting, named as its keyword (``beam=0: must be at least 1``), or
            ``replace_unk`` for a model whose vocabularies are not words (SentencePiece).

        :meth:`translate` takes its search from here, so that what this returns and what a call runs
        cannot drift apart.
        """
        decode = decode_config(decode_cfg or self.cfg.decode, beam, nbest, length_penalty, batch_size, flags=flags,
                               sampling=sampling, topk=topk, topp=topp, temperature=temperature, seed=seed,
                               replace_unk=replace_unk, precision=precision, warn=self._warn_once)
        self._check_replace_unk(decode, flags)
        return decode

    def _warn_once(self, text: str) -> None:
        """Log a search setting's warning (a length penalty under greedy search) the first time this
        Translator meets its text: ``cometnmt serve`` checks every request's settings here, and a
        client sending ``"length_penalty": 0.6`` without a beam logged the same warning with every
        request. Another value or search is another text, warned of once too. Past
        ``_WARNED_TEXTS`` texts (a client trying value after value) each is logged every time, as
        before, rather than kept: the set must not grow with what clients send."""
        with self._warned_lock:
            if text in self._warned:
                return
            if len(self._warned) < _WARNED_TEXTS:
                self._warned.add(text)
        log.warning("%s", text)

    def _check_replace_unk(self, decode: DecodeConfig, flags: bool = False) -> None:
        """``replace_unk`` copies source words, so both sides must be words (spaCy): a SentencePiece
        vocabulary keeps every piece of its training text, and a copied piece is no target piece."""
        kinds = {self.codec.src_tok.kind, self.codec.tgt_tok.kind}
        if decode.replace_unk and kinds != {"spacy"}:
            raise ConfigError(f"{'--replace-unk' if flags else 'decode.replace_unk'}: copies source "
                              f"words in place of <unk>, for word vocabularies (data.tokenizer: spacy); this model's "
                              f"tokenizer is {' and '.join(sorted(kinds))}")

    @_one_call_at_a_time
    def translate_ids(self, src_ids: list[list[int]], decode_cfg=None, progress: bool | tqdm = False, *,
                      start: int = 0, shard: tuple[int, int] = (0, 1)) -> list[list[Translation]]:
        """n-best translations of already-indexed sentences, in input order. ``start``: the place
        of ``src_ids[0]`` in a longer input, which keys sampling's random numbers (line i's
        stream is (seed, i)). ``progress``: True shows a bar of its own; a bar (tqdm) is advanced
        instead (one bar over an input translated piece by piece, as ``translate`` reads a file).
        The search is read as :meth:`translate` reads it (greedy search of ``nbest`` above 1 is a
        beam search): taken as it stood, a checkpoint of decode.nbest 3 gave
        one greedy hypothesis here and three of a beam from translate, and ``attention`` without
        targets attended the greedy one. ``shard`` (k, n): decode only the k-th of every n batches
        (a DDP rank's share of validation); the other sentences get no translation (``[]``). Each
        batch holds the sentences it holds unsharded, so a sentence's translation is the same.
        An empty sentence (a blank line) is not decoded: its ``nbest`` translations are blank, score 0
        (it was decoded from a source of ``</s>`` alone, at a search's cost, and the output dropped)."""
        decode_cfg = decode_config(decode_cfg or self.cfg.decode, flags=False)
        self._check_positions(src_ids, "input", "source", 0)
        out: list[list[Translation]] = [
            [] if ids else [Translation("", 0.0, []) for _ in range(decode_cfg.nbest)] for ids in src_ids]
        todo = [i for i, ids in enumerate(src_ids) if ids]
        seed = sampling_seed(decode_cfg)  # one per call; each sentence's stream is keyed by its place in src_ids
        own = not isinstance(progress, tqdm)
        bar = progress_bar(total=len(src_ids), desc="translate", unit="sent", disable=not progress,
                           leave=False) if own else progress
        bar.update(len(src_ids) - len(todo))  # the blank ones: done
        self.model.eval()
        try:
            # the search's arithmetic (decode.precision): autocast for bf16 and fp16
            with precision_context(self.device, decode_cfg.precision):
                for b, idx in enumerate(self._batches(src_ids, decode_cfg.batch_sentences, among=todo)):
                    if b % shard[1] != shard[0]:
                        bar.update(len(idx))
                        continue
                    # a thread asked to stop (reproduce's evaluations after Ctrl-C or at --deadline: interrupts.stop_on)
                    # stops here, within one batch, not after the whole split
                    check_stop()
                    batch = collate([src_ids[i] for i in idx], None, idx).to(self.device)
                    results = search(self.model, batch.src, batch.src_pad_mask, BOS, EOS, decode_cfg,
                                     src_specials=2 if self.codec.src_sos_eos else 0, seed=seed,
                                     keys=[start + i for i in idx])  # bound on words
                    for i, hyps in zip(idx, results):
                        out[i] = [self._text(h.tokens, h.score) for h in hyps]
                    bar.update(len(idx))
        finally:
            if own:
                bar.close()
        return out

    @staticmethod
    def _words_and_ids(texts: list[str], tokenizer, encode) -> tuple[list[list[str]], list[list[int]]]:
        """Sentences tokenised and indexed as in training: (their tokens, their ids); a blank one has no ids."""
        words = tokenizer.tokenize_many(texts)
        return words, [encode(tokens) if text.strip() else [] for tokens, text in zip(words, texts)]

    @classmethod
    def _ids(cls, texts: list[str], tokenizer, encode) -> list[list[int]]:
        return cls._words_and_ids(texts, tokenizer, encode)[1]

    def _sources(self, texts: Sequence[str] | CheckedSources, method: str) -> CheckedSources:
        """``texts`` checked (:func:`_check_sentences`) and tokenised for ``method`` (its name, for
        errors), or ``texts`` itself where it is :meth:`check_sources`'s result for this codec."""
        if isinstance(texts, CheckedSources):
            if texts.codec is self.codec:
                return texts
            texts = texts.texts  # checked, but tokenised for another model: its ids are not this vocabulary's
        texts = _check_sentences(_sentence_list(texts, "texts", method), f"{method} texts")
        words, ids = self._words_and_ids(texts, self.codec.src_tok, self.codec.encode_src)
        return CheckedSources(texts, words, ids, self.codec)

    def _check_positions(self, ids: list[list[int]], where: str, side: str, extra: int) -> None:
        """Before any decoding, so the whole input fails or none of it: each sequence plus ``extra``
        positions (a target's <s>) must fit the model's position tables."""
        limit = self.model.position_limit()
        too_long = [i for i, row in enumerate(ids) if limit is not None and len(row) + extra > limit]
        if too_long:
            i = too_long[0]
            more = f", as are {len(too_long) - 1} more lines" if len(too_long) > 1 else ""
            raise DataError(f"{where} line {i + 1}: {len(ids[i])} {side} tokens{' and <s>' if extra else ''}, more than the "
                            f"model's {limit} positions ({positions_key(self.cfg.model)}){more}; split or shorten it")

    @_one_call_at_a_time
    def check_sources(self, texts: Sequence[str]) -> CheckedSources:
        """Refuse, as :meth:`translate` would, sentences it would refuse, without decoding them: one
        that is not a string, holds a newline, a lone surrogate or a NUL character, or has more
        tokens than the model's positions (``input line 3: 1100 source tokens, more than the
        model's 1024 positions ...``). A caller that decodes several callers' sentences in one call
        (``cometnmt serve``'s batches) checks each caller's first, so that one bad sentence does not
        fail, and cost a second decode of, the others. A sentence that passes may still fail on
        something unforeseen (out of memory).

        Returns the sentences checked and tokenised (:class:`CheckedSources`): given to :meth:`translate`
        in place of ``texts`` (joined with ``+`` to others'), they are not tokenised a second time.

        :raises DataError: the first refused sentence, counted from 1 as :meth:`translate` counts it.
        """
        if isinstance(texts, str):
            raise TypeError("Translator.check_sources takes a list of sentences")
        sources = self._sources(texts, "Translator.check_sources")
        self._check_positions(sources.ids, "input", "source", 0)
        return sources

    @_one_call_at_a_time
    def log_prob_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]], batch_size: int | None = None,
                     progress: bool = False) -> list[float]:
        """Forced decoding of already-indexed pairs: each target's log-probability (its tokens and
        </s>), in input order; batches of ``batch_size`` sentences (default the decode config's)."""
        if len(src_ids) != len(tgt_ids):
            raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
        batch_size = check_batch_size(batch_size)
        self._check_positions(src_ids, "source", "source", 0)
        self._check_positions(tgt_ids, "target", "target", 1)
        out = [0.0] * len(src_ids)
        bar = progress_bar(total=len(src_ids), desc="score", unit="pair", disable=not progress, leave=False)
        self.model.eval()
        for idx in self._batches(tgt_ids, batch_size or self.cfg.decode.batch_sentences):  # similar lengths together
            batch = collate([src_ids[i] or [EOS] for i in idx], [tgt_ids[i] for i in idx], idx).to(self.device)
            scores = target_log_probs(self.model, batch.src, batch.src_pad_mask, batch.tgt_in, batch.tgt_out, PAD)  # B
            for i, value in zip(idx, scores.tolist()):
                out[i] = value
            bar.update(len(idx))
        bar.close()
        return out

    @_one_call_at_a_time
    def log_prob(self, sources: Sequence[str], targets: Sequence[str], *, batch_size: int | None = None,
                 progress: bool = False) -> list[PairScore]:
        """Forced decoding: how probable the model finds each given translation of each source,
        e.g. to rerank another system's n-best list or to measure perplexity on a test set. The
        target is tokenised and indexed as in training (words the vocabulary lacks become <unk>,
        counted in :attr:`PairScore.unknown`). An empty target scores the model's probability of
        stopping at once; an empty source is scored as the source ``</s>`` alone (where
        :meth:`translate` writes a blank line without decoding, with score 0)."""
        for name, texts in (("sources", sources), ("targets", targets)):
            if isinstance(texts, str):
                raise TypeError(f"Translator.log_prob takes lists of sentences; {name} is one string")
        sources = _sentence_list(sources, "sources", "Translator.log_prob")
        targets = _sentence_list(targets, "targets", "Translator.log_prob")
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} targets; give one target per source")
        sources = _check_sentences(sources, "Translator.log_prob sources")
        targets = _check_sentences(targets, "Translator.log_prob targets")
        check_batch_size(batch_size)
        src_ids = self._ids(sources, self.codec.src_tok, self.codec.encode_src)
        tgt_ids = self._ids(targets, self.codec.tgt_tok, self.codec.encode_tgt)
        scores = self.log_prob_ids(src_ids, tgt_ids, batch_size, progress)
        return [PairScore(score, len(ids) + 1, sum(i == UNK for i in ids)) for score, ids in zip(scores, tgt_ids)]

    @_one_call_at_a_time
    def attention(self, sources: Sequence[str], targets: Sequence[str] | None = None, *, layer: int = -1,
                  batch_size: int | None = None, progress: bool = False, flags: bool = False) -> list[AttentionMap]:
        """Where each target token looks in the source: the attention weights of decoder layer
        ``layer`` (default the last; negative counts from the end) over the source, averaged over
        heads, teacher-forced on ``targets`` (default: this model's own translations, with its
        checkpoint's search). For plots such as ``cometnmt attention`` draws; not an ensemble's.
        An error names ``layer`` as the keyword, or with ``flags`` as ``--layer``."""
        if isinstance(sources, str) or isinstance(targets, str):
            raise TypeError("Translator.attention takes lists of sentences")
        sources = _check_sentences(_sentence_list(sources, "sources", "Translator.attention"), "Translator.attention sources")
        src_ids = self._ids(sources, self.codec.src_tok, self.codec.encode_src)
        self._check_attention_layer(layer, flags)
        check_batch_size(batch_size, flags)  # before the model's own translations are decoded
        if targets is None:  # a blank line's translation is empty, as translate() leaves it, not decoded
            tgt_ids = self._best_ids(src_ids, progress)
        else:
            targets = _sentence_list(targets, "targets", "Translator.attention")
            if len(targets) != len(sources):
                raise DataError(f"{len(sources)} sources but {len(targets)} targets; give one target per source")
            targets = _check_sentences(targets, "Translator.attention targets")
            tgt_ids = self._ids(targets, self.codec.tgt_tok, self.codec.encode_tgt)
        return self.attention_ids(src_ids, tgt_ids, layer=layer, batch_size=batch_size, progress=progress, flags=flags)

    def _check_attention_layer(self, layer: int, flags: bool) -> int:
        """The decoder's number of layers, once ``layer`` is known to be one of them (before any decoding)."""
        if isinstance(self.model, Ensemble):
            raise CheckpointError("attention: give one checkpoint; an ensemble's members attend each in their own way")
        layers = len(self.model.cross_attention_modules())
        layer = plain_number(layer)
        if isinstance(layer, bool) or not isinstance(layer, int):  # "1" was a TypeError from the comparison, True layer 1
            raise ConfigError(f"{setting('layer', repr(layer), flags)}: must be an integer (0..{layers - 1}, or -1 for the last)")
        if not -layers <= layer < layers:
            # counted as the layers that attend to the source: the RNN's decoder attends once, after its
            # top layer, whatever model.rnn.dec_layers is (a 2-layer one was said to have 1 layer)
            raise ConfigError(f"{setting('layer', layer, flags)}: the decoder has {layers} layer{'s' * (layers != 1)} attending "
                              f"to the source (0..{layers - 1}, or -1 for the last)")
        return layers

    def _best_ids(self, src_ids: list[list[int]], progress: bool) -> list[list[int]]:
        """The model's best translation of each source, as ids (no detokenise/tokenise round trip);
        empty, undecoded, for an empty source (:meth:`translate_ids`)."""
        return [self.codec.tgt_vocab.encode(hyps[0].tokens) for hyps in self.translate_ids(src_ids, progress=progress)]

    @_one_call_at_a_time
    def attention_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]] | None = None, *, layer: int = -1,
                      batch_size: int | None = None, progress: bool = False, flags: bool = False) -> list[AttentionMap]:
        """:meth:`attention` of already-indexed sentences (targets: None for the model's own)."""
        layer = plain_number(layer)  # AttentionMap.layer a Python int, for json.dumps
        layers = self._check_attention_layer(layer, flags)
        batch_size = check_batch_size(batch_size, flags)
        if tgt_ids is None:
            tgt_ids = self._best_ids(src_ids, progress)
        self._check_positions(src_ids, "source", "source", 0)
        self._check_positions(tgt_ids, "target", "target", 1)
        out: list[AttentionMap | None] = [None] * len(src_ids)
        src_vocab, tgt_vocab = self.codec.src_vocab.itos, self.codec.tgt_vocab.itos
        bar = progress_bar(total=len(src_ids), desc="attention", unit="pair", disable=not progress, leave=False)
        for idx, weights in self._cross_attention(src_ids, tgt_ids, layer, batch_size):
            for row, i in enumerate(idx):
                src, tgt = src_ids[i] or [EOS], tgt_ids[i] + [EOS]
                out[i] = AttentionMap([src_vocab[j] for j in src], [tgt_vocab[j] for j in tgt],
                                      weights[row, : len(tgt), : len(src)].tolist(), layer % layers)
            bar.update(len(idx))
        bar.close()
        return out

    def _cross_attention(self, src_ids: list[list[int]], tgt_ids: list[list[int]], layer: int,
                         batch_size: int | None) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Teacher-forced attention of decoder layer ``layer`` over the source, heads averaged (and
        an ensemble's members, each its own layer ``layer``), in batches of similar target lengths:
        (the batch's places in the lists, its B,T,S weights; row t is the attention while the
        model predicts target token t, ``</s>`` last)."""
        members = list(self.model.members) if isinstance(self.model, Ensemble) else [self.model]
        self.model.eval()
        for idx in self._batches(tgt_ids, batch_size or self.cfg.decode.batch_sentences):
            batch = collate([src_ids[i] or [EOS] for i in idx], [tgt_ids[i] for i in idx], idx).to(self.device)
            weights = [m.cross_attention(batch.src, batch.src_pad_mask, batch.tgt_in)[layer].mean(1) for m in members]
            yield idx, sum(weights) / len(weights)

    def _replace_unknown(self, words: list[list[str]], src_ids: list[list[int]],
                         results: list[list[Translation]]) -> None:
        """``decode.replace_unk``, in place: each ``<unk>`` of each hypothesis becomes the source
        word that the last decoder layer's attention (heads averaged) weighs most as the model
        predicts it (Luong et al. 2015's copy of the aligned word; fairseq's ``--replace-unk``
        without a dictionary). One teacher-forced pass over the hypotheses that hold one."""
        unk = self.codec.tgt_vocab.itos[UNK]
        todo = [(i, k) for i, hyps in enumerate(results) if src_ids[i] for k, h in enumerate(hyps) if unk in h.tokens]
        if not todo:
            return
        first = 1 if self.codec.src_sos_eos else 0  # the source's <s>, which is no word
        tgt_ids = [self.codec.tgt_vocab.encode(results[i][k].tokens) for i, k in todo]
        for idx, weights in self._cross_attention([src_ids[i] for i, _ in todo], tgt_ids, -1, None):
            for row, j in enumerate(idx):
                i, k = todo[j]
                source, hyp = words[i], results[i][k]
                peaks = weights[row, : len(hyp.tokens), first : first + len(source)].argmax(-1).tolist()
                tokens = [source[peaks[t]] if tok == unk else tok for t, tok in enumerate(hyp.tokens)]
                results[i][k] = self._from_tokens(tokens, hyp.score)

    def _text(self, ids: list[int], score: float) -> Translation:
        return self._from_tokens(self.codec.tgt_vocab.decode(ids), score)

    def _from_tokens(self, tokens: list[str], score: float) -> Translation:
        text = self.codec.tgt_tok.detokenize(tokens)
        # one translation, one line: a line separator a model learned from its training text
        # (a SentencePiece piece holding "\r", say) would split it wherever outputs are read back;
        # and single spaces: an undertrained SentencePiece model may emit a lone "▁" piece before a
        # word ("▁", "▁dog": two spaces), or one at either end
        return Translation(_SPACES.sub(" ", _LINE_BREAKS.sub(" ", text)).strip(" "), score, tokens)

    @_one_call_at_a_time
    def translate(self, texts: Sequence[str] | CheckedSources, decode_cfg: DecodeConfig | None = None, progress: bool | tqdm = False, *,
                  beam: int | None = None, nbest: int | None = None, length_penalty: float | None = None,
                  batch_size: int | None = None, sampling: bool | None = None, topk: int | None = None,
                  topp: float | None = None, temperature: float | None = None,
                  seed: int | None = None, replace_unk: bool | None = None, precision: str | None = None,
                  start: int = 0) -> list[list[Translation]]:
        """Plain-text sentences in, n-best detokenised translations out, best first, in input
        order (a blank line gives ``nbest`` blank translations).

        :param texts: the sentences, one string each (not one string: see :meth:`__call__`), or
            what :meth:`check_sources` returned for them (not tokenised again).
        :param decode_cfg: search settings; default the checkpoint's ``decode`` config.
        :param beam: beam size, 1 for greedy search; ``nbest``, ``length_penalty`` (GNMT alpha)
            and ``batch_size`` (sentences per batch) likewise replace ``decode_cfg``'s.
        :param sampling: True draws each token at random (``nbest`` independent samples per
            sentence, highest score first), from the ``topk`` most probable tokens (0: all), then
            the nucleus of probability ``topp``, with the logits divided by ``temperature``;
            ``seed`` makes the call repeatable: a sentence's samples depend on the seed and its
            place in ``texts`` plus ``start`` (a caller that translates an input piece by piece,
            line by line say, passes each piece's place in it), not on the batch size or the other
            sentences. False: greedy search.
        :param progress: True shows a progress bar; a bar (tqdm) is advanced instead (:meth:`translate_ids`).
        :param replace_unk: True puts the source word the decoder attends to most in place of each
            ``<unk>`` of the output (word vocabularies only; the score stays the search's).
        :param precision: the search's arithmetic, ``decode.precision``: "fp32", or "bf16" / "fp16"
            under autocast (faster where the hardware has 16-bit matrix units: bf16 on CPUs with AMX,
            GPUs; a translation may then differ from fp32's where two words score nearly alike).
        :raises DataError: a sentence longer than the model's positions (before any decoding).
        """
        if isinstance(texts, str):
            raise TypeError("Translator.translate takes a list of sentences; for one sentence call translator(text)")
        decode_cfg = self.search_config(decode_cfg, beam=beam, nbest=nbest, length_penalty=length_penalty,
                                        batch_size=batch_size, sampling=sampling, topk=topk, topp=topp,
                                        temperature=temperature, seed=seed, replace_unk=replace_unk,
                                        precision=precision)
        start = plain_number(start)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:  # "x" was a TypeError from an addition
            raise ConfigError(f"start={start!r}: must be an integer at least 0 (the first sentence's place in the input)")
        sources = self._sources(texts, "Translator.translate")
        results = self.translate_ids(sources.ids, decode_cfg, progress, start=start)
        if decode_cfg.replace_unk:
            self._replace_unknown(sources.words, sources.ids, results)
        return results  # a blank text has no ids: nbest blank translations, as many rows as any other (translate_ids)

    def __call__(self, text: str | Sequence[str], *, beam: int | None = None, length_penalty: float | None = None,
                 batch_size: int | None = None, sampling: bool | None = None, topk: int | None = None,
                 topp: float | None = None, temperature: float | None = None, seed: int | None = None,
                 replace_unk: bool | None = None, precision: str | None = None) -> str | list[str]:
        """The best translation of one sentence (a string), or of each sentence of a list (with
        ``sampling``, one sample each; the settings are :meth:`translate`'s)."""
        single = isinstance(text, str)
        results = self.translate([text] if single else text, beam=beam, length_penalty=length_penalty,
                                 batch_size=batch_size, nbest=1, sampling=sampling, topk=topk, topp=topp,
                                 temperature=temperature, seed=seed, replace_unk=replace_unk, precision=precision)
        best = [r[0].text for r in results]
        return best[0] if single else best

    def split_files(self, split: str = "test") -> tuple[Path, Path]:
        """The source and reference files of a split of the model's own data (as
        :meth:`translate_split` reads them)."""
        check_split(split)
        return split_files(anchor_paths(self.cfg.data, self.workdir), split)

    def translate_split(self, split: str = "test", decode_cfg: DecodeConfig | None = None, *, limit: int | None = None,
                        progress: bool = False) -> SplitTranslation:
        """Translate a split (``train``, ``valid`` or ``test``) of the data the model was trained on,
        as its config names it (Multi30k, or ``data.corpus: files``, relative paths taken from the
        folder it was trained in), keeping the best hypothesis.

        :param limit: only the first ``limit`` sentence pairs (smoke runs).
        """
        limit = check_split(split, limit)
        corpus = read_split(anchor_paths(self.cfg.data, self.workdir), split)
        src, refs = corpus.src[:limit], corpus.tgt[:limit]
        try:
            with read_from_files():  # read_split warned of text not in NFC
                results = self.translate(src, decode_cfg, progress)
        except DataError as exc:  # name the file ("input line 3: ..." alone names no file)
            raise DataError(f"{corpus.src_path}: {_file_line(exc, corpus)}") from None
        return SplitTranslation(src, refs, [h[0].text for h in results], len(corpus.src))


def _file_line(exc: DataError, corpus) -> str:
    """``exc``'s "input line N: ..." with N the line of the split's file: the training split skips
    blank pairs (``read_parallel``), after which N counted the pairs kept and named another line
    (one skipped pair before it: the line above)."""
    message = str(exc)
    match = re.match(r"input line (\d+):", message)
    if not corpus.skipped or match is None:
        return message
    kept = [number for number, (s, t) in enumerate(zip(read_lines(corpus.src_path), read_lines(corpus.tgt_path)), 1)
            if s.strip() and t.strip()]
    return f"input line {kept[int(match.group(1)) - 1]}:{message[match.end():]}"
