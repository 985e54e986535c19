"""Typed configuration: YAML -> nested dataclasses, with strict checks and dotted overrides.

A run is described by one :class:`Config`. YAML files are loaded with :func:`load_config`; every
key must be a field of the matching dataclass, every value must have the field's type, and every
``Literal`` field must hold one of its choices. Errors name the dotted key (``train.lr``) and what
is allowed. ``configs/reference.yaml`` documents every key and its default; a test checks that it
is complete.

Architecture-specific hyper-parameters live next to the code that uses them (e.g.
:class:`cometnmt.models.comet.CometConfig`) and are nested here under ``model.<arch>``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from cometnmt.errors import ConfigError, DataError
from cometnmt.models.comet import CometConfig
from cometnmt.models.convs2s import ConvS2SConfig
from cometnmt.models.rnn import RNNConfig
from cometnmt.models.transformer_pp import TransformerPPConfig, check_config as check_transformer_pp


@dataclass
class DataConfig:
    """Where the parallel text comes from and how it becomes token ids."""

    corpus: Literal["multi30k", "files"] = "multi30k"  # multi30k: task 1, splits by *_split; files: the *_src/*_tgt paths
    multi30k_dir: Optional[str] = None  # folder of Multi30k's .gz files; null: $COMETNMT_MULTI30K_DIR, else download + verify
    src_lang: str = "de"  # source language code (lowercased): spaCy's tokenizer language; multi30k: de, en or fr
    tgt_lang: str = "en"  # target language code, as src_lang; also the paper metric's tokenizer language
    train_split: str = "train"  # corpus multi30k: the split trained on (train, val or test_2016_flickr)
    valid_split: str = "val"  # corpus multi30k: the split of validation loss and BLEU (train, val or test_2016_flickr)
    test_split: str = "test_2016_flickr"  # corpus multi30k: the split of evaluate --split test (train, val or test_2016_flickr)
    # corpus: files -- explicit paths (plain or gzip UTF-8, one sentence per line)
    train_src: Optional[str] = None  # corpus files: the training source file, plain or gzip UTF-8 (each split's _src and _tgt set together)
    train_tgt: Optional[str] = None  # corpus files: the training target file (required, with train_src)
    valid_src: Optional[str] = None  # corpus files: the validation source file (required, with valid_tgt)
    valid_tgt: Optional[str] = None  # corpus files: the validation target file (required, with valid_src)
    test_src: Optional[str] = None  # corpus files: the test source file (optional, with test_tgt; evaluate --split test)
    test_tgt: Optional[str] = None  # corpus files: the test target file (optional, with test_src)
    max_train_pairs: Optional[int] = None  # first N non-empty training pairs only (smoke runs); null: all
    max_valid_pairs: Optional[int] = None  # first N validation pairs only (validation loss and BLEU, --split valid); null: all
    tabs_are_text: bool = False  # true reads a side whose every line holds a tab (code, tables) as sentences (a tab is a space to the tokenizers); false refuses it as a tab-separated file of pairs
    tokenizer: Literal["spacy", "sentencepiece"] = "spacy"  # spacy: spaCy's words (min_freq applies); sentencepiece: subwords (sp_*)
    lowercase: bool = False  # lowercase both sides before tokenising (lowercase output; BLEU compares lowercased text)
    min_freq: int = 2  # word vocabularies (spacy): drop rarer tokens
    max_vocab: Optional[int] = None  # cap per language, the 4 special tokens included; most frequent kept
    sp_vocab_size: int = 8000  # sentencepiece: per language
    sp_model_type: Literal["unigram", "bpe"] = "unigram"  # sentencepiece: the model's algorithm, unigram or bpe
    max_len: int = 100  # training pairs longer than this (tokens, either side) are skipped, and not counted into the vocabularies
    src_sos_eos: bool = False  # COMET Table 1 "source SOS/EOS": wrap source in <s> ... </s>

    def __post_init__(self) -> None:
        # Language codes are case-insensitive, as `cometnmt evaluate --lang` takes them: 'DE' was
        # "not a language of Multi30k task 1" (whose files are train.de.gz, ...) and no language spaCy
        # tokenises, and under SentencePiece the paper's metric was skipped for want of an 'EN' tokenizer.
        for key in ("src_lang", "tgt_lang"):
            if isinstance(getattr(self, key), str):
                setattr(self, key, getattr(self, key).lower())


@dataclass
class ModelConfig:
    """Shared Transformer-family sizes plus one section per architecture."""

    arch: str = "transformer"  # transformer, comet, transformer_pp, convs2s or rnn (the last two read only their own section), or one registered (docs/architectures.md)
    d_model: int = 256  # transformer, comet, transformer_pp: width of embeddings and every unit's output; a multiple of n_heads
    n_heads: int = 8  # heads of every attention sublayer (transformer_pp self-attention: dot-product and convolution heads together)
    enc_layers: int = 3  # encoder units (N)
    dec_layers: int = 3  # decoder units
    d_ff: int = 2048  # hidden size of FFN_2 (eq. 6): every unit (transformer, transformer_pp), comet's ffn decoder units
    dropout: float = 0.1  # sublayer outputs, embeddings + positions (comet ffn1: its unit too; transformer_pp: see embed_dropout)
    attention_dropout: float = 0.0  # on attention probabilities (transformer, comet); 0 as in both papers
    max_positions: int = 1024  # sinusoidal position table: the longest source (src_sos_eos specials included) or target + BOS
    tie_embeddings: bool = False  # one matrix for target embeddings and output projection (Press & Wolf 2017): transformer, comet, transformer_pp
    comet: CometConfig = field(default_factory=CometConfig)
    convs2s: ConvS2SConfig = field(default_factory=ConvS2SConfig)
    rnn: RNNConfig = field(default_factory=RNNConfig)
    transformer_pp: TransformerPPConfig = field(default_factory=TransformerPPConfig)
    # Not a key: the sections of architectures registered with one (cometnmt.models.register_architecture),
    # written model.<arch>.* in a config file, read as model_cfg.<arch>. It holds the selected
    # architecture's section and those the config sets, so that a run of another architecture does not
    # need the module that registers them to load.
    plugin_sections: dict[str, Any] = field(default_factory=dict)  # not a key: model.<arch> of registered architectures

    def __post_init__(self) -> None:
        from cometnmt.models import SECTIONS

        if self.arch in SECTIONS and self.arch not in self.plugin_sections:  # its builder reads model_cfg.<arch>
            self.plugin_sections[self.arch] = SECTIONS[self.arch]()

    def __getattr__(self, name: str) -> Any:
        """``model_cfg.<arch>``: the section of an architecture registered with one."""
        sections = self.__dict__.get(PLUGIN_SECTIONS) or {}
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


PLUGIN_SECTIONS = "plugin_sections"  # ModelConfig's field of registered architectures' sections (not a key itself)


@dataclass
class TrainConfig:
    """Optimisation, stopping, checkpointing and logging."""

    seed: int = 1  # seeds weight initialisation, the epochs' batch order and dropout masks; 0 to 2**63 - 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # fp32; bf16, fp16: autocast (training, validation loss), fp16 with loss scaling
    compile: bool = False  # torch.compile the model (falls back to eager on failure)
    # torch.compile mode: reduce-overhead adds CUDA graphs (one recorded graph per batch shape; on the
    # CPU it compiles as default); max-autotune also searches kernels. Needs train.compile: true.
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"  # torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune(-no-cudagraphs)
    # CUDA: let scaled_dot_product_attention use its cuDNN kernels (PyTorch's default). On an H100 in
    # bf16 they cost a slow first call per new batch shape: COMET's first epoch ran at 7k target
    # tokens/s, later ones at 32-37k (bench/README.md). false = flash / memory-efficient kernels only.
    cudnn_attention: bool = True  # CUDA: attention may use cuDNN kernels (slow first call per batch shape on an H100)
    num_threads: Optional[int] = None  # torch.set_num_threads on the CPU; null: torch's default
    # Under DDP (torchrun): the process group's timeout (init_process_group's), how long a rank waits
    # for the others in one collective (joining included) before it stops with an error. The longest
    # wait is the other ranks' for rank 0 preparing the data: reading the corpus, training the
    # SentencePiece models, tagging for Transformer++; raise it where that takes longer.
    distributed_timeout_minutes: float = 30.0  # DDP: how long a rank waits for the others (rank 0 preparing the data, say) before it stops
    max_epochs: int = 100  # train at most this many epochs (the stopping rule or max_steps may end sooner)
    max_steps: Optional[int] = None  # optimizer steps taken (fp16: those the loss scaler skipped too); null: no limit. Stopping inside an epoch validates there (best.pt kept)
    batch_tokens: int = 4096  # per micro-batch, padded tokens of the longer side (target: +1 for BOS/EOS); a longer pair is a micro-batch of its own
    batch_sentences: Optional[int] = None  # cap sentences per micro-batch (the paper: 10); null: batch_tokens alone
    # Training batches are cut from sentences sorted by length in buckets this many tokens wide, so
    # 1 gives batches of one length (least padding) and a width above the longest sentence gives
    # batches of mixed lengths (more padding; batch-norm statistics then mix lengths as at test time).
    bucket_width: int = 1  # tokens per length bucket of training batches; large = mixed-length batches
    accum_steps: int = 1  # micro-batches per optimizer step
    lr: float = 1e-4  # Adam's learning rate (inverse_sqrt: the peak, reached at warmup_steps)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's beta1, beta2, each in [0, 1)
    eps: float = 1e-9  # Adam's epsilon (added to the denominator)
    weight_decay: float = 0.0  # Adam's L2 penalty, added to the gradients (torch.optim.Adam, not AdamW); 0: none
    schedule: Literal["constant", "inverse_sqrt"] = "constant"  # constant: lr at every step (the paper); inverse_sqrt: see warmup_steps
    warmup_steps: int = 4000  # inverse_sqrt: linear warmup to lr, then lr * sqrt(warmup/step), counting updates applied (fp16: not the skipped steps); constant: unused
    label_smoothing: float = 0.0  # eps in [0, 1), training loss only (validation loss and loss_rise: plain cross-entropy); 0: none
    clip_norm: Optional[float] = 1.0  # max total L2 norm of the gradients (all parameters) at each step; 0 or null: no clipping
    stopping: Literal["loss_rise", "bleu_patience", "none"] = "loss_rise"  # loss_rise, bleu_patience: see below; none: max_epochs/max_steps only
    loss_rise_epochs: int = 2  # paper: stop once validation loss rose this many epochs in a row (a NaN loss counts as a rise)
    patience: int = 5  # bleu_patience: epochs without a better validation BLEU
    valid_bleu: bool = True  # greedy-decode the validation set every epoch
    valid_bleu_max_sentences: Optional[int] = None  # validation BLEU on the first N validation sentences only; null: all
    # at each validation, heatmaps of the first N validation sentences' attention (last decoder layer,
    # heads averaged, on the model's greedy translation) in save_dir/attention/; 0: none
    attention_plots: int = 0  # attention heatmaps of the first N validation sentences at each validation; 0: none
    log_every: int = 50  # optimizer steps taken (fp16: skipped ones too) between metrics-log lines; a loss that is not a number stops the run at the next one
    save_every: Optional[int] = None  # also checkpoint `last` every N optimizer steps taken (fp16: skipped ones too); null: at epoch ends only
    keep_checkpoints: int = 0  # keep the last N epoch checkpoints for averaging
    save_dir: str = "runs/default"  # checkpoints, metrics.jsonl, train.log, config.yaml (relative: to the current folder)
    progress: bool = True  # tqdm bar on stderr


COMPILE_MODES = typing.get_args(typing.get_type_hints(TrainConfig)["compile_mode"])  # train.compile_mode's choices
PRECISIONS = typing.get_args(typing.get_type_hints(TrainConfig)["precision"])  # train.precision's and decode.precision's choices
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the ones that replay CUDA graphs (on CUDA)
SEED_LIMIT = 2**63  # seeds are 63-bit: torch.manual_seed refuses 2**64 and above
TIED_ARCHS = ("transformer", "comet", "transformer_pp")  # the Transformer family: they read the shared sizes (model.d_model, ...) and may tie embeddings
OWN_SECTION_ARCHS = ("convs2s", "rnn")  # they read only their own section: no shared sizes, no tied embeddings


@dataclass
class DecodeConfig:
    """Search used by `translate`, validation BLEU and evaluation."""

    method: Literal["greedy", "beam", "sample"] = "greedy"  # greedy, beam or sample (random sampling, e.g. for back-translation)
    beam_size: int = 5  # method beam: hypotheses kept per sentence (at least nbest)
    length_penalty: float = 1.0  # GNMT alpha (0 to 10): score / ((5 + len) / 6) ** alpha
    length_norm: Literal["gnmt", "length"] = "gnmt"  # beam ranking with length_penalty as alpha: gnmt, as above; length: score / len ** alpha (fairseq's --lenpen)
    nbest: int = 1  # hypotheses per sentence (translate, serve): the beam's best (method greedy too: a beam of beam_size), or independent samples (method sample)
    sampling_topk: int = 0  # sample: draw from the k most probable tokens only (0: the whole vocabulary)
    sampling_topp: float = 1.0  # sample: nucleus, the fewest tokens whose probability reaches p (after top-k; 1.0: off)
    temperature: float = 1.0  # sample: divides the logits (below 1: sharper, above: flatter; 1e-30 to 1e30)
    sampling_seed: Optional[int] = None  # sample: seed of each line's random stream (null: drawn from torch's global RNG)
    replace_unk: bool = False  # put the source word the decoder attends to most in place of each <unk> output (spacy tokenizer)
    max_len_a: float = 1.5  # output length bound: a * source tokens (without src_sos_eos specials) + b
    max_len_b: int = 10  # the b of max_len_a's bound (tokens, </s> included)
    batch_sentences: int = 128  # source sentences per search batch, sorted by length (validation BLEU, translate, evaluate, logprob)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # search arithmetic: fp32; bf16, fp16: autocast (bf16 on CPUs with AMX or AVX-512 BF16 and on GPUs from Ampere; fp16 on GPUs)


@dataclass
class Config:
    """A complete, self-describing run."""

    name: str = "run"  # the run's label: cometnmt compare keeps and reports each config's runs under it
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


# ---------------------------------------------------------------------------------------------
# dict <-> dataclass with strict checks


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _yaml_hint(value: Any, key: str, quote: bool = True) -> str:
    """For a string key that YAML read as a boolean or a number: why, and (``quote``) how to quote it.
    A choice of strings takes the why alone: quoting the value does not make it one of the choices."""
    if isinstance(value, bool):  # true or false (True, TRUE, ...): the word as written is gone
        word = str(value).lower()
        hint = f"; YAML reads {word} unquoted as the boolean {word}"
        return hint + (f": quote it, e.g. {key}='{word}'" if quote else "")
    if isinstance(value, (int, float)):
        hint = "; YAML reads an unquoted number as a number"
        if not quote:
            return hint
        # a float's text is YAML's reading, not the value as written: 1e5 was told to quote '100000.0'
        return hint + (f": quote the value, e.g. {key}='{value}'" if isinstance(value, int) else ": quote the value as you wrote it")
    return ""


def _list_hint(value: Any) -> str:
    """For a list key given ``0.9,0.98`` (or Python's ``(0.9, 0.98)``, which was told to write
    ``[(0.9, 0.98)]``, failing the same way): how to write the list."""
    if isinstance(value, str) and "," in value:
        return f"; a list is written in brackets: [{value.strip().removeprefix('(').removesuffix(')')}]"
    return ""


def _coerce(value: Any, tp: Any, key: str, build: bool = True) -> Any:
    """Check ``value`` against type ``tp``; return it (int -> float allowed). Raise ConfigError.
    ``build`` False: sections stay dicts (:func:`from_dict`)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:  # an empty section ("data:" with nothing under it) keeps the defaults
            value = {}
        if not isinstance(value, dict):
            raise ConfigError.at(key, f"expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, key, build)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, build)
            except ConfigError:
                continue
        # the hints of the one type a null-or-X key takes (data.multi30k_dir=2024 had none, docs/errors.md promises it)
        hint = _yaml_hint(value, key) if str in args else _list_hint(value) if any(typing.get_origin(a) is list for a in args) else ""
        raise ConfigError.at(key, f"expected {_type_name(tp)}, got {value!r}{hint}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError.at(key, f"{value!r} is not allowed; expected {_type_name(tp)}{_yaml_hint(value, key, quote=False)}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError.at(key, f"expected {_type_name(tp)}, got {value!r}{_list_hint(value)}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            # YAML 1.1's yes/no/on/off are text to cometnmt's loader (YAML 1.2, as data.src_lang: no needs)
            hint = "; YAML 1.2 reads only true and false as booleans" if str(value).lower() in YAML11_BOOLEANS else ""
            raise ConfigError.at(key, f"expected true or false, got {value!r}{hint}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError.at(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError.at(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, os.PathLike):  # a pathlib.Path set from Python
            value = os.fspath(value)
        if not isinstance(value, str):
            raise ConfigError.at(key, f"expected a string, got {value!r}{_yaml_hint(value, key)}")
        return value
    raise TypeError(f"unsupported config type {tp!r} for '{key}'")  # programming error, not user error


def config_keys(cls: type) -> dict[str, Any]:
    """The keys of dataclass ``cls`` and their types: its fields, and for :class:`ModelConfig` the
    sections of the architectures registered with one (``model.<arch>``) in place of the field
    holding them."""
    hints = {name: tp for name, tp in typing.get_type_hints(cls).items() if not (cls is ModelConfig and name == PLUGIN_SECTIONS)}
    if cls is ModelConfig:
        from cometnmt.models import SECTIONS

        hints.update(SECTIONS)
    return hints


def check_arch(arch: str) -> None:
    """``model.arch`` names a registered architecture; else a ConfigError with the closest names."""
    from cometnmt.models import REGISTRY

    if arch not in REGISTRY:
        # cutoff 0.75: typos (transfomer, comte), not a name merely alike (dwconv, of a missing plugin: convs2s)
        close = difflib.get_close_matches(arch, sorted(REGISTRY), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError.at("model.arch", f"{arch!r} is not allowed; expected one of {', '.join(sorted(REGISTRY))}{hint}")


def from_dict(cls: type, data: dict, prefix: str = "", build: bool = True) -> Any:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types. ``build`` False
    checks the keys and types only and returns the checked dict: a file or base may leave a
    cross-key rule (model.comet.dilations, one per feature layer, say) for a child or an override to
    meet, which the sections' own checks, run as they are built, would refuse."""
    hints = config_keys(cls)
    if cls is ModelConfig and isinstance(data.get("arch"), str):  # with the file's other keys, so that its error names the file
        check_arch(data["arch"])  # and first: a checkpoint of an unregistered architecture is named by it, not by its section
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            raise ConfigError(f"unknown config key '{dotted}'; allowed keys here: {', '.join(hints)}{_section_hint(cls, value)}",
                              keys=(dotted,))
        kwargs[key] = _coerce(value, hints[key], dotted, build)
    if not build:
        return kwargs
    from cometnmt.models import SECTIONS

    if cls is ModelConfig:
        kwargs[PLUGIN_SECTIONS] = {key: kwargs.pop(key) for key in list(kwargs) if key in SECTIONS}
    if cls not in SECTIONS.values():
        return cls(**kwargs)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # a registered section's own checks (the package's raise ConfigError)
        raise ConfigError.at(prefix, f"{type(exc).__name__}: {exc}") from None


def _section_hint(cls: type, value: Any) -> str:
    """For an unknown mapping under ``model``: where a section of one's own architecture comes from."""
    if cls is not ModelConfig or not isinstance(value, dict):
        return ""
    return ("; the section of an architecture of one's own is known once the module registering it with "
            "cometnmt.models.register_architecture(..., config=...) is imported: for the CLI, name it in $COMETNMT_PLUGINS")


def to_dict(cfg: Any) -> dict:
    """Plain nested dict (YAML/JSON/pickle friendly). The sections of registered architectures are
    keys of ``model`` beside the package's own (``model.mine.*``), as a config file writes them."""
    data = dataclasses.asdict(cfg)
    model = data.get("model") if isinstance(cfg, Config) else data if isinstance(cfg, ModelConfig) else None
    if model is not None:
        model.update(model.pop(PLUGIN_SECTIONS))
    return data


def _section_type(dotted: str) -> Any:
    """The dataclass of the section at ``dotted`` (``model.comet``: CometConfig); None for a key that
    is no section (a value, or unknown: :func:`from_dict` names those)."""
    tp: Any = Config
    for part in dotted.split("."):
        tp = config_keys(tp).get(part) if dataclasses.is_dataclass(tp) else None
    return tp if dataclasses.is_dataclass(tp) else None


def _null_section(dotted: str, value: Any) -> str | None:
    """The first section that the mapping ``value`` (set at ``dotted``) gives as null, at any depth
    (``model={comet: null}``: "model.comet"); None if it gives none."""
    if not isinstance(value, dict) or _section_type(dotted) is None:
        return None
    for key, item in value.items():
        inner = f"{dotted}.{key}"
        if item is None and _section_type(inner) is not None:
            return inner
        if (found := _null_section(inner, item)) is not None:
            return found
    return None


def _keys_listed_in(dotted: str) -> str:
    """Where a section's keys are listed: configs/reference.yaml for the package's, the registered
    dataclass for an architecture of one's own (``model.<arch>``, not in reference.yaml)."""
    from cometnmt.models import SECTIONS

    parts = dotted.split(".")
    if len(parts) >= 2 and parts[0] == "model" and parts[1] in SECTIONS:
        cls = SECTIONS[parts[1]]
        return f"the dataclass {cls.__module__}.{cls.__qualname__} registered for {parts[1]!r}"
    return "configs/reference.yaml"


def _set_dotted(data: dict, dotted: str, value: Any, text: str | None = None) -> None:
    """Set ``value`` at the dotted key. A section the file left empty (``data:``, read as null) is
    an empty section here too: ``--set data.max_len=50`` on such a file said 'data' is not a section.
    A section may not be set to null: it reset the section to the defaults (``--set model=null`` on
    comet.yaml trained a Transformer), while in a file an empty (null) section keeps the base's; nor
    inside a mapping (``model={comet: null}``). ``text``: the override as written, for that error."""
    if value is None and _section_type(dotted) is not None:
        raise ConfigError(f"override '{dotted}=null': '{dotted}' is a section, not a value (null neither resets nor "
                          f"clears it); set its keys, {dotted}.KEY=VALUE ({_keys_listed_in(dotted)} lists them)")
    if (section := _null_section(dotted, value)) is not None:  # the same null inside a mapping: --set
        # 'model={comet: null}' merged key by key, so the base's comet section stayed without a word
        raise ConfigError(f"override '{text or dotted}': '{section}' is a section, not a value (null neither resets nor "
                          f"clears it); set its keys, {section}.KEY=VALUE ({_keys_listed_in(section)} lists them)")
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        child = node[part]
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
        node = child
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict) and _section_type(dotted) is not None:
        # key by key, as a child file's section merges over its base's: --set 'model.comet={kernel_size: 5}'
        # replaced the whole section, so comet_bn_length.yaml's bn_length_bounds fell back to null
        value = _merge(node[parts[-1]], value)
    node[parts[-1]] = value


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-3`` and ``5E4`` as numbers (YAML 1.2 does; PyYAML follows
    YAML 1.1, where a float needs a dot and a signed exponent, so ``lr: 1e-3`` was the string
    "1e-3" and failed as "expected a number"), and only true and false as booleans (YAML 1.2;
    ``yes``, ``no``, ``on`` and ``off`` are text). A key given twice in one mapping is an error naming
    both lines: PyYAML kept the last silently, so a ``lr:`` further down the file (a base's key
    pasted in, say) overrode the one being edited."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<' merges may override keys, as YAML means them to
                line = key_node.start_mark.line + 1
                if key_node.value in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found the key '{key_node.value}' a second time (first on line "
                        f"{first_line[key_node.value]}; keep one)", key_node.start_mark)
                first_line[key_node.value] = line
        return super().construct_mapping(node, deep=deep)


    def construct_yaml_int(self, node):
        """Integers as YAML 1.2 reads them: YAML 1.1 took a leading zero for octal and colons for base
        60, so ``seed: 010`` trained with seed 8 and ``max_epochs: 1:30`` ran 90 epochs, without a
        word. A leading zero is decimal (010 is 10), ``0o17`` octal (15); ``1:30`` is the text it is."""
        text = self.construct_scalar(node)
        if ":" in text:
            return text
        if text.startswith("0o"):  # YAML 1.2's octal (1.1 had none: seed: 0o17 was text, refused)
            return int(text[2:], 8)
        digits = text.replace("_", "").lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits.isdigit():
            return int(text.replace("_", ""), 10)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        """``1:30.5`` is text, not YAML 1.1's base-60 float 90.5 (as :meth:`construct_yaml_int`)."""
        text = self.construct_scalar(node)
        return text if ":" in text else super().construct_yaml_float(node)


_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")  # 1e-3, 5E4
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
_LEADING_ZERO_INT = re.compile(r"^[-+]?0[0-9_]+$")  # 08 and 09 too, which YAML 1.1 read as text (no octal digits)
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _LEADING_ZERO_INT, list("-+0"))
_OCTAL_INT = re.compile(r"^0o[0-7]+$")  # YAML 1.2's octal: 0o17 is 15
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _OCTAL_INT, list("0"))
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
# Booleans as YAML 1.2 reads them: true and false only. YAML 1.1 also took yes, no, on and off, so
# the language code of Norwegian (data.src_lang: no) was the boolean false and refused.
for _first in list(_Loader.yaml_implicit_resolvers):
    _Loader.yaml_implicit_resolvers[_first] = [(tag, regexp) for tag, regexp in _Loader.yaml_implicit_resolvers[_first]
                                               if tag != "tag:yaml.org,2002:bool"]
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
YAML11_BOOLEANS = ("yes", "no", "on", "off")  # text to cometnmt's loader, booleans to YAML 1.1's (any case)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting a string that :class:`_Loader` reads as a number: a name or
    save_dir ``1e5`` (or ``09``) was written unquoted to a run's config.yaml and read back as
    100000.0, so the saved config did not load ("config key 'name': expected a string")."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
_Dumper.add_implicit_resolver("tag:yaml.org,2002:int", _LEADING_ZERO_INT, list("-+0"))
_Dumper.add_implicit_resolver("tag:yaml.org,2002:int", _OCTAL_INT, list("0"))


def yaml_load(stream) -> Any:
    """A YAML document (text or an open file) with :class:`_Loader`: configs, overrides and a
    run's saved ``config.yaml`` read alike."""
    return yaml.load(stream, Loader=_Loader)


def yaml_dump(data: Any) -> str:
    """``data`` as YAML text that :func:`yaml_load` reads back equal (a run's ``config.yaml``)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def parse_override(text: str) -> tuple[str, Any]:
    """``train.lr=3e-4`` -> ("train.lr", 0.0003); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}' has no key")
    try:
        value = yaml_load(raw) if raw.strip() else ""
        # ' #' starts a YAML comment: --set 'train.save_dir=runs/exp #3' trained into runs/exp, and
        # data.multi30k_dir=#2 was null, without a word
        node = yaml.compose(raw.strip(), Loader=_Loader) if raw.strip() else None
        if raw.strip().startswith("#") or (node is not None and node.end_mark.index < len(raw.strip())):
            raise ConfigError(f"override '{text}': ' #' starts a YAML comment, which would leave the value {value!r}; "
                              f"quote the value to keep the '#' ({key}='{raw.strip()}')")
    except yaml.YAMLError as exc:  # was a traceback (train.lr=[1, train.betas={a: 1, a: 2})
        raise ConfigError(f"override '{text}': the value is not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(value, str) and raw.strip()[:1] not in ("'", '"'):
        # an unquoted string Python reads as a number ("inf", say) is one; 3e-4 is one already
        # (_Loader). A quoted one stays a string (name='2024'), as in a YAML file
        try:
            value = float(value)
        except ValueError:
            pass
    return key, value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (or defaults when ``path`` is None), apply dotted overrides, validate."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'section.key=value' strings, got the string {overrides!r}")
    parsed = [(text, *parse_override(text)) for text in overrides or []]
    arch_replaced = any(_sets_arch(key, value) for _, key, value in parsed)
    data = _read_yaml(Path(path).expanduser(), arch_replaced=arch_replaced) if path is not None else {}  # "~": as base: and the data paths
    if path is not None:  # the file's own keys and types first, so an error there names the file
        try:
            from_dict(Config, _without_arch(data) if arch_replaced else copy.deepcopy(data), build=False)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}", keys=exc.keys) from None
    for text, key, value in parsed:
        _set_dotted(data, key, value, text)
    with origin_named(path, overrides):  # a value's own rule (train.lr: -1) or a rule across keys, checked once merged
        return config_from_dict(data)


def name_origin(exc: ConfigError | DataError, path: str | Path | None, overrides: list[str] | None) -> ConfigError | DataError:
    """``exc``, an error on the config that :func:`load_config` read from ``path`` and ``overrides``
    (``--set``'s ``section.key=value``), naming where the refused value came from: ``exc`` itself
    where an override set a key it names (``exc.keys``, the refused one first), where it names none
    or where there is no file; else a new error naming the file of ``path``'s base chain that set
    the refused key, or ``path`` where none does. load_config names its rules' errors so; ``cometnmt
    train``, :func:`cometnmt.train` and compare's and reproduce's checks name so the errors of the
    checks training makes itself (file pairs data.corpus multi30k ignores, the built model), and the
    DataErrors of a data file a config key named ("config key 'data.train_src': a.de: file not
    found"), as DataErrors."""
    overridden = [parse_override(text)[0] for text in overrides or []]
    if path is None or not exc.keys or any(_overlaps(key, named) for key in overridden for named in exc.keys):
        return exc
    refused = exc.keys[0].split("[")[0]  # train.betas[1]: the file sets train.betas
    try:  # the chain is read again: training's own checks come minutes after it loaded, and a file may have changed
        text = _in_file(Path(path).expanduser(), refused, exc)
    except (OSError, ValueError, AttributeError, RecursionError, yaml.YAMLError, ConfigError):
        text = None
    named = (DataError if isinstance(exc, DataError) else ConfigError)(text or f"{path}: {exc}", keys=exc.keys)
    if hasattr(exc, "relayed_line"):  # another rank's error (distributed.rank_error): still one line in the CLI
        named.relayed_line = exc.relayed_line
    return named


@contextlib.contextmanager
def origin_named(path: str | Path | None, overrides: list[str] | None):
    """A ConfigError or DataError raised inside, named as :func:`name_origin` names it."""
    try:
        yield
    except (ConfigError, DataError) as exc:
        named = name_origin(exc, path, overrides)
        if named is exc:
            raise
        raise named from None


def _overlaps(key: str, dotted: str) -> bool:
    """Whether an override of ``key`` sets ``dotted`` or a key inside it (or ``dotted`` lies inside ``key``)."""
    return key == dotted or dotted.startswith(key + ".") or key.startswith(dotted + ".")


def _in_file(path: Path, dotted: str, exc: ConfigError, child: Path | None = None) -> str | None:
    """``exc``, a rule's error on ``dotted`` (``train.lr: -1``: "config key 'train.lr': must be a
    positive finite number, got -1.0", naming no file), naming the file of ``path``'s base chain
    whose value the config took, the child's over its base's, as the file checks name them ("BASE:
    ... (the base of CHILD)"); None where no file sets it (a default another key's rule refuses).
    The chain is read again: it was read whole before, so it has no loop."""
    loaded = yaml_load(path.read_text(encoding="utf-8"))
    node: Any = loaded
    for part in dotted.split("."):
        node = node.get(part, _UNSET) if isinstance(node, dict) else _UNSET
    if node is not _UNSET and not (node is None and _section_type(dotted) is not None):  # an empty section keeps the base's
        return f"{path}: {exc}" + (f" (the base of {child})" if child is not None else "")
    if isinstance(loaded.get("base"), str):
        return _in_file(path.parent / Path(loaded["base"]).expanduser(), dotted, exc, path)
    return None


_UNSET = object()  # a key a file does not set


def _sets_arch(key: str, value: Any) -> bool:
    """Whether the override ``key=value`` sets model.arch (``model.arch=...`` or ``model={arch: ...}``)."""
    return key == "model.arch" or (key == "model" and isinstance(value, dict) and "arch" in value)


def _without_arch(data: dict) -> dict:
    """A copy of a file's ``data`` without its model.arch name, for checking a file whose architecture
    a child or an override replaces: ``--set model.arch=transformer`` on a file with a typo there, or
    naming an architecture of a plugin not loaded, was refused for the file's name (checked against
    the registry, :func:`check_arch`). The replacing name is checked when the config is built."""
    data = copy.deepcopy(data)
    if isinstance(data.get("model"), dict) and isinstance(data["model"].get("arch"), str):
        del data["model"]["arch"]
    return data


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """A new, validated Config: ``cfg`` with dotted ``key=value`` overrides (as ``--set``) applied."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides must be a list of 'section.key=value' strings, got the string {overrides!r}")
    data = to_dict(cfg)
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(data, key, value, text)
    return config_from_dict(data)


def _merge(base: dict, override: dict) -> dict:
    """``override``'s keys over ``base``'s, section by section. An empty section (``model:`` with its
    keys commented out, read as null) keeps the base's section: it replaced it with the defaults, so
    a child of comet.yaml with an empty ``model:`` trained a Transformer without a word."""
    out = dict(base)
    for key, value in override.items():
        if value is None and isinstance(out.get(key), dict):
            continue
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = (), arch_replaced: bool = False) -> dict:
    """Read one preset. A top-level ``base: other.yaml`` (relative to this file; "~" is the home
    folder) is read first and this file's keys are merged over it, section by section.
    ``arch_replaced``: a child or an override sets model.arch, so a base's is not checked."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, expected a YAML config file" + (f" (the base of {seen[-1]})" if seen else ""))
    if not path.is_file():
        # a relative base is read from the child's folder, not the current one: say which folder that was
        raise ConfigError(f"config file not found: {path}" + (
            f" (the base of {seen[-1]}): a relative base: is taken from that file's folder, {seen[-1].parent}, "
            "not the current one; give the path from there, or an absolute one" if seen else ""))
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' chain loops back to itself")
    try:
        with open(path, encoding="utf-8") as f:  # a stream, so YAML's error marks name the file
            loaded = yaml_load(f)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if loaded is None:  # nothing but comments: a mistake, not "train everything with the defaults"
        raise ConfigError(f"{path}: empty; a config sets at least one section (or 'base: other.yaml'); "
                          "configs/reference.yaml lists every key")
    if not isinstance(loaded, dict):
        what = {list: "a list", str: "a single value", int: "a number", float: "a number", bool: "true/false"}.get(
            type(loaded), type(loaded).__name__)
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, train:, ...), "
                          f"got {what}" + (" (a YAML line starting with '- ' makes a list)" if isinstance(loaded, list) else ""))
    data = loaded
    base = data.pop("base", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: config key 'base' must be a file name, got {base!r}", keys=("base",))
    if seen:  # a base: its own keys and types, so that an error names the file to edit, not the child
        try:
            from_dict(Config, _without_arch(data) if arch_replaced else copy.deepcopy(data), build=False)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc} (the base of {seen[-1]})", keys=exc.keys) from None
    if base is None:
        return data
    sets_arch = isinstance(data.get("model"), dict) and "arch" in data["model"]
    # "~" is the home folder, as in the data paths and train.save_dir: base: ~/presets/x.yaml was
    # looked for in a folder named "~" beside this file
    return _merge(_read_yaml(path.parent / Path(base).expanduser(), seen + (path.resolve(),), arch_replaced or sets_arch), data)


def config_from_dict(data: dict) -> Config:
    cfg = from_dict(Config, data)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Cross-field checks that types alone cannot express."""
    from cometnmt.models import check_builder_signature

    check_arch(cfg.model.arch)
    check_builder_signature(cfg.model.arch)
    # the shared Transformer sizes only where the architecture reads them: ConvS2S and the RNN take
    # theirs from their own sections, and a ConvS2S config with model.n_heads: 7 was refused. One
    # registered with uses=(...) reads those it declares; one registered without may read any, so
    # none may be below 1 (model.d_model: 0 was a ZeroDivisionError from its builder), and
    # model.n_heads must divide model.d_model
    reads = model_keys_read(cfg.model.arch)
    arch_named = ("model.arch",) if reads is None else ()  # _may_read_any's words name it
    sizes = {f"model.{key}": getattr(cfg.model, key) for key in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "max_positions")
             if reads is None or key in reads}
    for key, value in sizes.items():
        if value < 1:
            raise ConfigError.at(key, f"must be at least 1, got {value}{_may_read_any(cfg.model.arch, reads)}",
                                 also=arch_named)
    for key in ("max_train_pairs", "max_valid_pairs"):
        value = getattr(cfg.data, key)
        if value is not None and value < 0:
            raise ConfigError.at(f"data.{key}", f"must be at least 0 (or null for all), got {value}")
    for key in ("lr", "eps"):
        value = getattr(cfg.train, key)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError.at(f"train.{key}", f"must be a positive finite number, got {value}")
    if not (math.isfinite(cfg.train.weight_decay) and cfg.train.weight_decay >= 0):
        raise ConfigError.at("train.weight_decay", f"must be a finite number at least 0, got {cfg.train.weight_decay}")
    if not 0.0 <= cfg.train.label_smoothing < 1.0:
        raise ConfigError.at("train.label_smoothing", f"{cfg.train.label_smoothing} must be in [0, 1)")
    if cfg.train.clip_norm is not None and not (math.isfinite(cfg.train.clip_norm) and cfg.train.clip_norm >= 0):
        raise ConfigError.at("train.clip_norm", "must be a finite number at least 0 (0 or null: no clipping), "
                             f"got {cfg.train.clip_norm}")
    if (reads is None or {"d_model", "n_heads"} <= reads) and cfg.model.d_model % cfg.model.n_heads:
        raise ConfigError.at("model.n_heads", f"{cfg.model.n_heads} does not divide model.d_model={cfg.model.d_model}"
                             f"{_may_read_any(cfg.model.arch, reads)}", also=("model.d_model", *arch_named))
    if (reads is None or "dropout" in reads) and not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError.at("model.dropout", f"{cfg.model.dropout} must be in [0, 1)"
                             f"{_may_read_any(cfg.model.arch, reads)}", also=arch_named)
    if not 0.0 <= cfg.model.attention_dropout < 1.0:
        raise ConfigError.at("model.attention_dropout", f"{cfg.model.attention_dropout} must be in [0, 1)")
    builtin = cfg.model.arch in TIED_ARCHS + OWN_SECTION_ARCHS
    if cfg.model.attention_dropout and (cfg.model.arch not in ("transformer", "comet") if builtin
                                        else reads is not None and "attention_dropout" not in reads):
        hint = ("; set model.transformer_pp.attention_dropout instead" if cfg.model.arch == "transformer_pp" else
                "" if builtin else f"; register_architecture({cfg.model.arch!r}, ..., uses=...) does not name it")
        raise ConfigError.at("model.attention_dropout", f"applies to the transformer and comet architectures"
                             f"{'' if builtin else ' and those that declare it'}, not {cfg.model.arch!r}{hint}",
                             also=("model.arch",) + (("model.transformer_pp.attention_dropout",)
                                                     if cfg.model.arch == "transformer_pp" else ()))
    # model.arch in these rules' keys: `--set model.arch=convs2s` over a file's tie_embeddings: true
    # is the override's error, which name_origin blamed on the file
    if cfg.model.tie_embeddings and cfg.model.arch in OWN_SECTION_ARCHS:  # a registered one of a script's: when built
        raise ConfigError.at("model.tie_embeddings", f"applies to the {', '.join(TIED_ARCHS)} architectures, "
                             f"not {cfg.model.arch!r}", also=("model.arch",))
    if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", cfg.train.device):  # whether this machine has it: when training starts
        raise ConfigError.at("train.device", f"{cfg.train.device!r} is not a device; use auto, cpu, cuda or cuda:N")
    if cfg.train.compile_mode != "default" and not cfg.train.compile:
        raise ConfigError.at("train.compile_mode", f"{cfg.train.compile_mode!r} needs train.compile: true",
                             also=("train.compile",))
    if len(cfg.train.betas) != 2:
        raise ConfigError.at("train.betas", f"expected two numbers, got {cfg.train.betas}")
    if not all(0.0 <= beta < 1.0 for beta in cfg.train.betas):  # nan fails too; was torch's error after the data had loaded
        raise ConfigError.at("train.betas", f"Adam's two decay rates must be in [0, 1), got {cfg.train.betas}")
    positive = {
        "train.batch_tokens": cfg.train.batch_tokens,
        "train.accum_steps": cfg.train.accum_steps,
        "train.bucket_width": cfg.train.bucket_width,
        "train.max_epochs": cfg.train.max_epochs,
        "data.max_len": cfg.data.max_len,
    }
    if cfg.train.batch_sentences is not None:
        positive["train.batch_sentences"] = cfg.train.batch_sentences
    for key, value in positive.items():
        if value < 1:
            raise ConfigError.at(key, f"must be at least 1, got {value}")
    if cfg.train.log_every < 1:
        raise ConfigError.at("train.log_every", f"must be at least 1, got {cfg.train.log_every}")
    at_least = {"train.loss_rise_epochs": (cfg.train.loss_rise_epochs, 1), "train.patience": (cfg.train.patience, 1),
                "train.keep_checkpoints": (cfg.train.keep_checkpoints, 0), "train.attention_plots": (cfg.train.attention_plots, 0)}
    optional = {"train.valid_bleu_max_sentences": cfg.train.valid_bleu_max_sentences, "train.save_every": cfg.train.save_every,
                "train.max_steps": cfg.train.max_steps}
    at_least.update({key: (value, 1) for key, value in optional.items() if value is not None})
    for key, (value, low) in at_least.items():
        if value < low:
            raise ConfigError.at(key, f"must be at least {low}{' (or null)' if key in optional else ''}, got {value}")
    if not 0 <= cfg.train.seed < SEED_LIMIT:
        raise ConfigError.at("train.seed", f"must be in [0, 2**63), got {cfg.train.seed}")
    if cfg.train.schedule == "inverse_sqrt" and cfg.train.warmup_steps < 1:
        raise ConfigError.at("train.warmup_steps", "must be at least 1 with train.schedule=inverse_sqrt "
                             f"(its learning rate is 0 without warmup), got {cfg.train.warmup_steps}",
                             also=("train.schedule",))
    if cfg.train.stopping == "bleu_patience" and not cfg.train.valid_bleu:
        raise ConfigError.at("train.stopping", "bleu_patience stops on validation BLEU, which needs train.valid_bleu: true",
                             also=("train.valid_bleu",))
    if cfg.data.tokenizer == "sentencepiece" and cfg.data.sp_vocab_size < 5:
        raise ConfigError.at("data.sp_vocab_size", "must be at least 5 (an unknown piece and a few characters), "
                             f"got {cfg.data.sp_vocab_size}")
    if cfg.data.corpus == "multi30k":
        from cometnmt.data.multi30k import LANGS, SPLITS

        for key in ("train_split", "valid_split", "test_split"):
            if getattr(cfg.data, key) not in SPLITS:
                raise ConfigError.at(f"data.{key}", f"{getattr(cfg.data, key)!r} is not a Multi30k task-1 split "
                                     f"this package knows; expected one of {', '.join(SPLITS)} (other files: data.corpus: files)",
                                     also=("data.corpus",))
        # as the splits, now rather than when training reads the data: compare and reproduce load every
        # config first, but a language Multi30k lacks stopped only its own runs, after the others trained
        for key in ("src_lang", "tgt_lang"):
            if getattr(cfg.data, key) not in LANGS:
                raise ConfigError.at(f"data.{key}", f"{getattr(cfg.data, key)!r} is not a language of Multi30k task 1 "
                                     f"that this package knows; expected one of {', '.join(LANGS)} (other files: data.corpus: files)",
                                     also=("data.corpus",))
        if cfg.data.src_lang == cfg.data.tgt_lang:
            raise ConfigError(f"config keys 'data.src_lang' and 'data.tgt_lang': both {cfg.data.src_lang!r}; Multi30k's "
                              "source and target language must differ", keys=("data.src_lang", "data.tgt_lang"))
    if cfg.decode.replace_unk and cfg.data.tokenizer != "spacy":
        raise ConfigError.at("decode.replace_unk", "copies source words in place of <unk>, for word "
                             f"vocabularies (data.tokenizer: spacy), not {cfg.data.tokenizer!r}",
                             also=("data.tokenizer",))
    if cfg.data.min_freq < 1:
        raise ConfigError.at("data.min_freq", f"must be at least 1 (1 keeps every word), got {cfg.data.min_freq}")
    if not 0 < cfg.train.distributed_timeout_minutes < math.inf:  # nan fails too
        raise ConfigError.at("train.distributed_timeout_minutes", "must be a positive finite number of minutes, "
                             f"got {cfg.train.distributed_timeout_minutes}")
    if cfg.train.num_threads is not None and cfg.train.num_threads < 1:
        raise ConfigError.at("train.num_threads", "must be at least 1 (or null: torch's default), "
                             f"got {cfg.train.num_threads}")
    if cfg.data.max_vocab is not None and cfg.data.max_vocab < 5:
        raise ConfigError.at("data.max_vocab", "must be at least 5 (4 special tokens and a word) or null, "
                             f"got {cfg.data.max_vocab}")
    _check_max_len(cfg)
    check_decode(cfg.decode)
    if cfg.model.arch == "transformer_pp":  # now, not after the taggers have run over the corpus
        check_transformer_pp(cfg.model)
    _check_split_files(cfg.data)


def _check_max_len(cfg: Config) -> None:
    """A training pair may have ``data.max_len`` tokens a side, plus <s> </s> around the source with
    ``data.src_sos_eos`` and the target's BOS: all must fit the architecture's position table (none
    for the RNN, nor for an architecture registered with uses=(...) that does not name
    model.max_positions). Checked at load, as train's own check (which remains for --init-from's
    tables) came only after the corpus was read and, for Transformer++, tagged. The architecture
    picks the limit and the key that names it, so model.arch is among the error's keys: ``--set
    model.arch=convs2s`` over a file whose model.convs2s.max_positions its transformer never read
    is the override's error, not the file's."""
    reads = model_keys_read(cfg.model.arch)
    if cfg.model.arch == "rnn" or (cfg.model.arch != "convs2s" and reads is not None and "max_positions" not in reads):
        return
    limit = cfg.model.convs2s.max_positions if cfg.model.arch == "convs2s" else cfg.model.max_positions
    extra = 2 if cfg.data.src_sos_eos else 1
    if cfg.data.max_len + extra > limit:
        raise ConfigError(f"config keys 'data.max_len' and '{positions_key(cfg.model)}': {cfg.data.max_len} tokens "
                          f"(+{extra} for {'<s> </s> around sources' if extra == 2 else 'the target BOS'}) exceed the "
                          f"model's {limit} positions; lower data.max_len or raise {positions_key(cfg.model)}",
                          keys=max_len_keys(cfg))


def max_len_keys(cfg: Config) -> tuple[str, ...]:
    """The keys of an error that data.max_len (and the <s> </s> or BOS around it) exceeds the
    positions: the positions' key is the architecture's, and with data.src_sos_eos the sources take
    two positions more, so an override of model.arch or of data.src_sos_eos can be what made it."""
    return ("data.max_len", positions_key(cfg.model), "model.arch", *(("data.src_sos_eos",) if cfg.data.src_sos_eos else ()))


DATA_PATH_KEYS = ("multi30k_dir", "train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt")  # data keys naming files


def _check_split_files(data: DataConfig) -> None:
    """``data.<split>_src`` and ``data.<split>_tgt`` go together: both or neither (a test pair with
    one side set was accepted, and then evaluate --split test failed or the key was ignored); with
    data.corpus 'files' the train and valid pairs are required, the test pair optional. A path key
    may not be empty: ``--set data.multi30k_dir=`` was taken for null without a word."""
    for key in DATA_PATH_KEYS:
        if isinstance(getattr(data, key), str) and not getattr(data, key).strip():
            raise ConfigError.at(f"data.{key}", "empty; give a path, or null for the default")
    for split in ("train", "valid", "test"):
        src, tgt = getattr(data, f"{split}_src"), getattr(data, f"{split}_tgt")
        keys = f"config keys 'data.{split}_src' and 'data.{split}_tgt'"
        if (src is None) != (tgt is None):
            (given, value), unset = ((f"data.{split}_src", src), f"data.{split}_tgt") if tgt is None else \
                ((f"data.{split}_tgt", tgt), f"data.{split}_src")
            unused = "" if data.corpus == "files" else " (data.corpus is 'multi30k', which reads neither: set data.corpus: files to use them)"
            either = "or neither" if split == "test" or data.corpus != "files" else f"(the {split} split is required)"
            raise ConfigError(f"{keys} go together: {given} is {value!r} but {unset} is null; set both {either}{unused}",
                              keys=(f"data.{split}_src", f"data.{split}_tgt") + (("data.corpus",) if unused else ()))
        if data.corpus == "files" and split != "test" and src is None:
            # a corpus of one's own often comes as one pair of files: say how to make a dev set of it
            hold_out = ("; without a validation set, hold out a few hundred training pairs, the same lines of both "
                        "files (tail -n 500 FILE > dev.FILE; head -n $(($(wc -l < FILE) - 500)) FILE > train.FILE, "
                        "for data.train_src and data.train_tgt)") if split == "valid" else ""
            raise ConfigError(f"{keys}: required when data.corpus is 'files'{hold_out}",
                              keys=(f"data.{split}_src", f"data.{split}_tgt", "data.corpus"))


def check_unread_files(data: DataConfig) -> None:
    """Before a training run: with data.corpus 'multi30k', file pairs under ``data.<split>_src/_tgt``
    are read by nothing, and a config that sets them (a user who forgot ``corpus: files``) trained
    on Multi30k without a word. Checked when training starts, not in :func:`validate`, so that a
    checkpoint whose config has them still loads."""
    if data.corpus != "multi30k":
        return
    given = [f"data.{split}_{side}" for split in ("train", "valid", "test") for side in ("src", "tgt")
             if getattr(data, f"{split}_{side}") is not None]
    if given:
        raise ConfigError(f"config key{'s' if len(given) > 1 else ''} {', '.join(repr(k) for k in given)}: set, but "
                          f"data.corpus is 'multi30k', which reads no file pairs (it would train on Multi30k's "
                          f"{data.train_split} split): set data.corpus: files to train on them, or remove them",
                          keys=(*given, "data.corpus"))


def unread_multi30k_dir(data: DataConfig) -> str | None:
    """The words of a warning when ``data.multi30k_dir`` is set beside data.corpus 'files', which
    reads no such folder (nor takes relative file paths from it): a config setting both trained on
    the files without a word about the folder. None when there is nothing to say. A warning, not an
    error as :func:`check_unread_files`' is: the run reads the data its config names, and a base
    preset may set the folder. ``$COMETNMT_MULTI30K_DIR`` is a machine's setting, not a run's, and
    goes unnamed."""
    if data.corpus != "files" or data.multi30k_dir is None:
        return None
    return (f"config key 'data.multi30k_dir' is set ({data.multi30k_dir!r}) but unused: data.corpus is 'files', which "
            f"reads the data.<split>_src/_tgt files (relative paths from the current folder, not from that one); "
            f"remove the key (or null it) to silence this")


_SHARED_MODEL_KEYS = ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "dropout", "attention_dropout",
                      "max_positions", "tie_embeddings")  # the Transformer family's; ConvS2S and the RNN read none
_PACKAGE_SECTIONS = ("comet", "convs2s", "rnn", "transformer_pp")  # model.<arch>.* of the package's architectures
# What register_architecture(..., uses=...) may name: the shared keys a builder reads, and the package's
# sections (model.comet.* for a COMET variant). Not tie_embeddings: build_model ties, through the model's
# tie_embeddings(), whatever the builder reads.
USABLE_MODEL_KEYS = tuple(key for key in _SHARED_MODEL_KEYS if key != "tie_embeddings") + _PACKAGE_SECTIONS


def model_keys_read(arch: str) -> frozenset[str] | None:
    """The shared keys (``d_model``, ...) and the package's sections (``comet``, ...) that the
    architecture ``arch`` reads, its own section among them; None where that is unknown: an
    architecture registered without ``uses=`` (its builder may read any key). :func:`validate`
    checks the sizes among them, and :func:`unused_model_keys` lists the others."""
    from cometnmt.models import USES

    if arch in TIED_ARCHS:
        return frozenset(_SHARED_MODEL_KEYS) | {arch}
    if arch in OWN_SECTION_ARCHS:
        return frozenset({arch})
    if arch in USES:
        return USES[arch] | {arch, "tie_embeddings"}  # tie_embeddings: build_model's, through its model
    return None


def _may_read_any(arch: str, reads: frozenset[str] | None) -> str:
    """The words after a shared key's error for an architecture registered without ``uses=``."""
    if reads is not None:
        return ""
    return (f" (model.arch {arch!r} was registered without uses=(...), so its builder may read any shared key; "
            f"register_architecture({arch!r}, ..., uses=...) names those it reads)")


def positions_key(model: ModelConfig) -> str:
    """The key that sizes ``model.arch``'s position tables, for messages."""
    return "model.convs2s.max_positions" if model.arch == "convs2s" else "model.max_positions"


def unused_model_keys(model: ModelConfig) -> list[str]:
    """``model.KEY=value`` for each key the architecture ``model.arch`` does not read but that is set
    away from its default: the shared Transformer sizes for convs2s and rnn, and every other
    architecture's section (those of registered architectures too). A run with such keys trains
    without them, which is worth a warning (``model.d_model=512`` beside ``arch: convs2s`` changes
    nothing). For an architecture registered with ``uses=(...)``, the keys it does not declare; none
    for one registered without (its builder may read any key: the shared sizes, or ``model.comet.*``
    for a COMET variant)."""
    reads = model_keys_read(model.arch)
    if reads is None:
        return []
    default = ModelConfig()
    found = [f"model.{key}={getattr(model, key)!r}" for key in _SHARED_MODEL_KEYS
             if key not in reads and getattr(model, key) != getattr(default, key)]
    for section in _PACKAGE_SECTIONS:
        if section not in reads:
            found += [f"model.{section}.{key}={new!r}" for key, old, new in changed_keys(to_dict(getattr(default, section)),
                                                                                          to_dict(getattr(model, section)))]
    for section, value in model.plugin_sections.items():  # a registered architecture's, beside another
        if section not in reads:
            found += [f"model.{section}.{key}={new!r}" for key, old, new in changed_keys(to_dict(type(value)()), to_dict(value))]
    return found


def changed_keys(old: dict, new: dict, prefix: str = ""):
    """(dotted key, old value, new value) for every leaf where two nested config dicts differ."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            yield from changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            yield f"{prefix}{key}", a, b


# GNMT's alpha above this scales a score by ((5 + length) / 6) ** alpha beyond float32's range at
# the longest outputs, so every hypothesis would score 0 (or a Python float overflow). Practical
# values are 0 to 2.
LENGTH_PENALTY_MAX = 10.0
# Temperatures whose float32 value is 0 or inf (or whose quotient is) turn the sampling logits into
# NaNs; inside this range float32 keeps the temperature and the logits' order.
TEMPERATURE_RANGE = (1e-30, 1e30)


def length_penalty_problem(alpha: float) -> str | None:
    """Why ``alpha`` is no usable length penalty (None if it is): the words after the key or flag."""
    if not (math.isfinite(alpha) and 0 <= alpha <= LENGTH_PENALTY_MAX):
        return f"must be a number from 0 to {LENGTH_PENALTY_MAX:g}"
    return None


def temperature_problem(temperature: float) -> str | None:
    """Why ``temperature`` is no usable sampling temperature (None if it is)."""
    low, high = TEMPERATURE_RANGE
    if not (math.isfinite(temperature) and temperature > 0):
        return "must be a positive finite number"
    if not low <= temperature <= high:
        return f"must be from {low:g} to {high:g} (float32 keeps it there; below {low:g} sampling is greedy search anyway)"
    return None


def check_decode(decode: DecodeConfig) -> None:
    """A ``decode`` section's own checks: a config's, or one a caller hands ``Translator.translate``
    (whose ``beam_size=0`` was "nbest=1: more hypotheses than the beam keeps (0)")."""
    for key in ("beam_size", "nbest", "batch_sentences"):
        if getattr(decode, key) < 1:
            raise ConfigError.at(f"decode.{key}", f"must be at least 1, got {getattr(decode, key)}")
    _check_sampling(decode)
    _check_search(decode)
    if decode.method != "sample" and decode.nbest > decode.beam_size:
        raise ConfigError.at("decode.nbest", f"{decode.nbest} exceeds decode.beam_size={decode.beam_size}",
                             also=("decode.beam_size",))


def _check_search(decode: DecodeConfig) -> None:
    """The length penalty and length bound (checked whatever ``decode.method`` is). A nan or
    negative bound gave one-token outputs without a word; the penalty follows --length-penalty's rule."""
    if (problem := length_penalty_problem(decode.length_penalty)) is not None:
        raise ConfigError.at("decode.length_penalty", f"{problem}, got {decode.length_penalty}")
    if not (math.isfinite(decode.max_len_a) and decode.max_len_a >= 0):
        raise ConfigError.at("decode.max_len_a", f"must be a finite number at least 0, got {decode.max_len_a}")
    if decode.max_len_b < 0:
        raise ConfigError.at("decode.max_len_b", f"must be at least 0, got {decode.max_len_b}")
    if decode.max_len_a == 0 and decode.max_len_b < 1:
        raise ConfigError.at("decode.max_len_b", "must be at least 1 with decode.max_len_a: 0 (the bound on "
                             "output tokens is max_len_a * source tokens + max_len_b)",
                             also=("decode.max_len_a",))


def _check_sampling(decode: DecodeConfig) -> None:
    """The sampling keys' ranges (checked whatever ``decode.method`` is, as the other keys are)."""
    if decode.sampling_topk < 0:
        raise ConfigError.at("decode.sampling_topk", "must be at least 0 (0: the whole vocabulary), "
                             f"got {decode.sampling_topk}")
    if not 0.0 < decode.sampling_topp <= 1.0:
        raise ConfigError.at("decode.sampling_topp", f"{decode.sampling_topp} must be in (0, 1] (1: off)")
    if (problem := temperature_problem(decode.temperature)) is not None:
        raise ConfigError.at("decode.temperature", f"{problem}, got {decode.temperature}")
    if decode.sampling_seed is not None and not 0 <= decode.sampling_seed < SEED_LIMIT:
        raise ConfigError.at("decode.sampling_seed", f"must be in [0, 2**63) (or null), got {decode.sampling_seed}")


# ---------------------------------------------------------------------------------------------
# configs/reference.yaml is generated from these dataclasses (and their comments), so it cannot
# drift from the code: `python -m cometnmt.config > configs/reference.yaml`; a test checks it.


def _field_comments(cls: type) -> dict[str, str]:
    import inspect
    import re

    comments = {}
    for line in inspect.getsource(cls).splitlines():
        match = re.match(r"\s+(\w+):[^#]*#\s*(.*)$", line)
        if match:
            comments[match.group(1)] = match.group(2).strip()
    return comments


def _reference_lines(cls: type, indent: int) -> list[str]:
    pad = "  " * indent
    lines = []
    doc = (cls.__doc__ or "").strip().splitlines()
    if doc:
        lines.append(f"{pad}# {doc[0]}")
    comments = _field_comments(cls)
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if cls is ModelConfig and f.name == PLUGIN_SECTIONS:  # not a key: registered architectures' sections
            continue
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            lines += _reference_lines(type(value), indent + 1)
            continue
        # one line per key: wrapped at 80 columns, ner_types went on at an indentation below its key's
        # (PyYAML tolerates it), and a copy of its first line was no list at all
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        comment = f"  # {comments[f.name]}" if f.name in comments else ""
        if value is None:  # a null default shows no type: the schema's ("int or null"), so one knows what to write
            comment = f"  # ({_type_name(hints[f.name])}){comment.removeprefix('  #')}"
        lines.append(f"{pad}{f.name}: {text}{comment}")
    return lines


def reference_yaml() -> str:
    header = [
        "# Every configuration key with its default value (generated: python -m cometnmt.config).",
        "# Presets under configs/ override a few of these; `--set section.key=value` overrides any.",
        "# A preset may start with `base: other.yaml` (relative path) to extend another preset.",
    ]
    return "\n".join(header + _reference_lines(Config, 0)) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(reference_yaml())
