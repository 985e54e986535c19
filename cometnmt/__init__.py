"""cometnmt: neural machine translation with convolution + attention architectures.

The Python API (see :mod:`cometnmt.api` and the README's *Python API*)::

    import cometnmt
    summary = cometnmt.train("configs/tiny.yaml", ["train.save_dir=runs/demo"])
    translator = cometnmt.Translator.from_checkpoint("runs/demo/best.pt")
    translator("Ein Mann fährt Fahrrad.")

Names are imported on first use, so ``import cometnmt`` (and ``cometnmt --version``) stays fast.
"""

__version__ = "0.1.0"

from cometnmt.lazy import lazy_exports

_EXPORTS = {
    "Config": "cometnmt.config",
    "load_config": "cometnmt.config",
    "apply_overrides": "cometnmt.config",
    "train": "cometnmt.api",
    "evaluate_checkpoint": "cometnmt.api",
    "average_checkpoints": "cometnmt.api",
    "last_epoch_checkpoints": "cometnmt.api",
    "Translator": "cometnmt.inference",
    "Translation": "cometnmt.inference",
    "SplitTranslation": "cometnmt.inference",
    "PairScore": "cometnmt.inference",
    "AttentionMap": "cometnmt.inference",
    "make_server": "cometnmt.serve",
    "score": "cometnmt.evaluation",
    "evaluate": "cometnmt.evaluation",
    "paired_bootstrap": "cometnmt.evaluation",
    "CometNMTError": "cometnmt.errors",
    "ConfigError": "cometnmt.errors",
    "DataError": "cometnmt.errors",
    "CheckpointError": "cometnmt.errors",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports("cometnmt", globals(), _EXPORTS)
