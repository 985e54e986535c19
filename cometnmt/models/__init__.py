"""Architectures by name. One plain dict; each builder takes
``(model_cfg, src_vocab_size, tgt_vocab_size, pad_id)`` and returns a :class:`Seq2Seq`.

A script may add its own (``REGISTRY["mine"] = build_mine``), or one with a config section of its own
(``register_architecture("mine", build_mine, config=MineConfig)``: ``model.mine.*``, in
:data:`SECTIONS`). The CLI also imports the modules
named by ``$COMETNMT_PLUGINS`` before it runs (:func:`load_plugins`), so that ``cometnmt train``,
``translate`` and the ``cometnmt train`` processes that ``compare``, ``reproduce`` and ``torchrun``
start, which inherit the variable, all know such an architecture.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable

from cometnmt.errors import ConfigError, a_type
from cometnmt.models.base import Seq2Seq
from cometnmt.models.comet import build_comet
from cometnmt.models.convs2s import build_convs2s
from cometnmt.models.rnn import build_rnn
from cometnmt.models.transformer import build_transformer
from cometnmt.models.transformer_pp import build_transformer_pp

Builder = Callable[..., Seq2Seq]
log = logging.getLogger(__name__)

REGISTRY: dict[str, Builder] = {
    "transformer": build_transformer,
    "comet": build_comet,
    "convs2s": build_convs2s,
    "rnn": build_rnn,
    "transformer_pp": build_transformer_pp,
}


# The config sections of architectures registered with one (register_architecture): model.<arch>.*,
# typed and checked as the package's own, and handed to the builder as model_cfg.<arch>
SECTIONS: dict[str, type] = {}
# The shared model.* keys and package sections that the builder of an architecture registered with
# uses=(...) reads (register_architecture): the config loader checks those sizes, and train warns of the
# others when set. An architecture absent here may read any key.
USES: dict[str, frozenset[str]] = {}

BUILTIN_ARCHS = tuple(REGISTRY)  # the package's own; others are registered by a script or $COMETNMT_PLUGINS
PLUGINS_ENV = "COMETNMT_PLUGINS"

# what a Seq2Seq must define itself (reorder has a default); decode, or decode_features under the
# default decode (its output layer out_proj on them)
PROTOCOL = ("encode", "decode", "init_state", "step")


def register_architecture(name: str, builder: Builder, config: type | None = None,
                          uses: tuple[str, ...] | None = None) -> None:
    """Register ``builder`` as the architecture ``name`` (as ``REGISTRY[name] = builder``) and, with
    ``config`` (a dataclass whose every field has a default and a config type: bool, int, float,
    str, a Literal, a list or Optional of those, or another such dataclass), its own config section
    ``model.<name>``: its keys are checked as the package's (an unknown key or a wrong type names
    ``model.<name>.<key>``), saved in the run's config.yaml and checkpoints, and the builder reads
    them as ``model_cfg.<name>`` (the defaults where the config sets none).

    ``uses`` names the shared keys (``"d_model"``, ``"n_heads"``, ...) and the package's sections
    (``"comet"`` for a COMET variant) that the builder reads, as the package's architectures are
    known to: the config loader checks those sizes (``model.d_model: 0`` is an error naming the key)
    and ``train`` warns of the others when a config sets them, as it does for ConvS2S's
    ``model.d_model``. Building the model checks it: a shared key or section the builder reads that
    ``uses`` does not name is a warning (:func:`build_model`). Without it the builder may read any key: none is warned of, and every
    shared size is checked."""
    section = "" if config is None else f", config={getattr(config, '__name__', config)!r}"
    what = f"register_architecture({name!r}, ...{section})"
    read = None if uses is None else _checked_uses(what, uses)
    if config is not None:
        _check_section(what, name, config)
    REGISTRY[name] = builder
    if config is None:
        SECTIONS.pop(name, None)  # registered again without one
    else:
        SECTIONS[name] = config
    if read is None:
        USES.pop(name, None)
    else:
        USES[name] = read


def _check_section(what: str, name: str, config: object) -> None:
    """``config`` can be the section ``model.<name>``: a dataclass of config keys, each with a default."""
    from cometnmt.config import ModelConfig, from_dict, to_dict

    if not (isinstance(name, str) and name.isidentifier()):
        raise ConfigError(f"{what}: an architecture with a config section needs a name that is a Python identifier "
                          f"(its keys are model.<name>.KEY)")
    if name in {f.name for f in dataclasses.fields(ModelConfig)}:
        raise ConfigError(f"{what}: 'model.{name}' is a key of the package's own; name the architecture otherwise")
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise ConfigError(f"{what}: config must be a dataclass (its fields are the keys of model.{name}), got {a_type(config)}")
    try:
        defaults = config()
        from_dict(config, to_dict(defaults), f"model.{name}")  # every field's type is one a config file can hold
    except TypeError as exc:
        raise ConfigError(f"{what}: {config.__name__} cannot be a config section: {exc}") from None


def _checked_uses(what: str, uses: object) -> frozenset[str]:
    """``uses`` as a set of names of :data:`cometnmt.config.USABLE_MODEL_KEYS`; a ConfigError naming the others."""
    from cometnmt.config import USABLE_MODEL_KEYS

    if not isinstance(uses, (tuple, list, set, frozenset)) or not all(isinstance(key, str) for key in uses):
        raise ConfigError(f"{what}: uses must be a tuple of key names such as ('d_model', 'n_heads'), got {uses!r}")
    unknown = [key for key in uses if key not in USABLE_MODEL_KEYS]
    if unknown:
        raise ConfigError(f"{what}: uses names {', '.join(repr(key) for key in unknown)}, not a shared model key or "
                          f"section a builder reads; expected some of {', '.join(USABLE_MODEL_KEYS)}")
    return frozenset(uses)


def build_model(model_cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> Seq2Seq:
    """Build the architecture named by ``model_cfg.arch`` (validated by the config loader). A builder
    registered wrongly (another signature, not returning a :class:`Seq2Seq` that defines the
    protocol) is a ConfigError naming the architecture and builder, not a traceback from training."""
    builder = REGISTRY[model_cfg.arch]
    check_builder_signature(model_cfg.arch)
    model = _build_checking_uses(model_cfg.arch, builder, model_cfg, src_vocab_size, tgt_vocab_size, pad_id)
    _check_built_model(model_cfg.arch, builder, model)
    if model_cfg.tie_embeddings:
        if type(model).tie_embeddings is Seq2Seq.tie_embeddings:  # a script's architecture (the config loader refuses convs2s, rnn)
            raise ConfigError.at("model.tie_embeddings", f"{type(model).__name__}, built by the builder registered as "
                                 f"{model_cfg.arch!r}, does not define tie_embeddings() (Seq2Seq.tie_embeddings)",
                                 also=("model.arch",))
        model.tie_embeddings()
    return model


_RECORDING = threading.Lock()  # one recorded build at a time: the recorder is ModelConfig's, for the build's length


def _build_checking_uses(arch: str, builder: Builder, model_cfg, *sizes: int) -> Seq2Seq:
    """``builder(model_cfg, *sizes)``. For an architecture registered with ``uses=(...)``, which the
    config loader trusts (it checks those keys' sizes, and train warns of the others as unused), the
    shared keys and package sections the builder reads are recorded, ModelConfig's attribute reads
    in this thread while it runs, and those ``uses`` does not name are a warning. dataclasses'
    own reads (``dataclasses.replace(model_cfg, d_ff=...)`` reads every field) are not the builder's."""
    from cometnmt.config import USABLE_MODEL_KEYS, ModelConfig

    if arch not in USES:
        return builder(model_cfg, *sizes)
    read: set[str] = set()
    thread = threading.get_ident()

    def recording(self, name: str):
        if (name in USABLE_MODEL_KEYS and threading.get_ident() == thread
                and sys._getframe(1).f_globals.get("__name__") != "dataclasses"):
            read.add(name)
        return object.__getattribute__(self, name)

    with _RECORDING:
        ModelConfig.__getattribute__ = recording
        try:
            model = builder(model_cfg, *sizes)
        finally:
            del ModelConfig.__getattribute__
    undeclared = [key for key in USABLE_MODEL_KEYS if key in read and key not in USES[arch]]
    if undeclared:
        log.warning("model.arch %r: its builder %s read %s, which register_architecture(%r, ..., uses=...) does not "
                    "name: the config loader does not check them and train calls them unused; add them to uses",
                    arch, _builder_name(builder), ", ".join(f"model.{key}" for key in undeclared), arch)
    return model


def _builder_name(builder: Builder) -> str:
    return f"{getattr(builder, '__module__', '?')}.{getattr(builder, '__qualname__', repr(builder))}"


def check_builder_signature(arch: str) -> None:
    """The builder registered as ``arch`` takes ``(model_cfg, src_vocab_size, tgt_vocab_size,
    pad_id)`` positionally (checked by the config loader too, before any data is read)."""
    builder = REGISTRY[arch]
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):  # a callable Python cannot introspect: let the call tell
        return
    try:
        signature.bind(None, 0, 0, 0)
    except TypeError as exc:
        raise ConfigError.at("model.arch", f"the builder registered as {arch!r} ({_builder_name(builder)}{signature}) "
                             f"cannot be called as builder(model_cfg, src_vocab_size, tgt_vocab_size, pad_id): {exc}") from None


def _check_built_model(arch: str, builder: Builder, model: object) -> None:
    """What the builder returned is a Seq2Seq that defines every protocol method itself."""
    if not isinstance(model, Seq2Seq):
        raise ConfigError.at("model.arch", f"the builder registered as {arch!r} ({_builder_name(builder)}) returned "
                             f"{a_type(model)}, not a cometnmt.models.base.Seq2Seq (a subclass defining {', '.join(PROTOCOL)})")
    missing = [name for name in PROTOCOL if getattr(type(model), name) is getattr(Seq2Seq, name)
               and not (name == "decode" and type(model).decode_features is not Seq2Seq.decode_features)]
    if missing:
        raise ConfigError.at("model.arch", f"{type(model).__name__}, built by the builder registered as {arch!r} "
                             f"({_builder_name(builder)}), does not define {', '.join(missing)} of the Seq2Seq protocol "
                             f"(cometnmt/models/base.py)")


def load_plugins() -> None:
    """Import each module ``$COMETNMT_PLUGINS`` names (comma-separated: a module name importable
    from ``sys.path``, or a ``.py`` file), whose import registers architectures in REGISTRY. A
    module that does not import is a ConfigError naming it and the line that failed, one that calls
    ``sys.exit()`` as it imports (SystemExit) too; Ctrl-C (KeyboardInterrupt) stays an interrupt."""
    for entry in (e.strip() for e in os.environ.get(PLUGINS_ENV, "").split(",")):
        if not entry:
            continue
        try:
            if entry.endswith(".py"):
                _import_file(Path(entry).expanduser())
            else:
                importlib.import_module(entry)
        except (Exception, SystemExit) as exc:  # SystemExit: a plugin's sys.exit() ended the CLI without a word
            frames = [f for f in traceback.extract_tb(exc.__traceback__)  # the plugin's own line, if it failed there
                      if not f.filename.startswith(("<", os.path.dirname(importlib.__file__))) and f.filename != __file__]
            where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            raise ConfigError(f"${PLUGINS_ENV}: cannot import {entry!r}{where}: {type(exc).__name__}: {exc}") from exc


def _import_file(path: Path) -> None:
    """Run a plugin file once per process, as module ``cometnmt_plugin_<stem>_<digest of its
    resolved path>``: two files of one name in different folders are two plugins."""
    if not path.is_file():
        raise FileNotFoundError(f"no file {path} (from the folder {Path.cwd()})")
    digest = hashlib.sha256(str(path.resolve()).encode("utf-8")).hexdigest()[:12]
    name = f"cometnmt_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
