"""Architectures by name. One plain dict; each builder takes
``(model_cfg, src_vocab_size, tgt_vocab_size, pad_id)`` and returns a :class:`Seq2Seq`."""

from __future__ import annotations

from typing import Callable

from cometnmt.models.base import Seq2Seq
from cometnmt.models.comet import build_comet
from cometnmt.models.convs2s import build_convs2s
from cometnmt.models.rnn import build_rnn
from cometnmt.models.transformer import build_transformer
from cometnmt.models.transformer_pp import build_transformer_pp

Builder = Callable[..., Seq2Seq]

REGISTRY: dict[str, Builder] = {
    "transformer": build_transformer,
    "comet": build_comet,
    "convs2s": build_convs2s,
    "rnn": build_rnn,
    "transformer_pp": build_transformer_pp,
}


def build_model(model_cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> Seq2Seq:
    """Build the architecture named by ``model_cfg.arch`` (validated by the config loader)."""
    model = REGISTRY[model_cfg.arch](model_cfg, src_vocab_size, tgt_vocab_size, pad_id)
    if model_cfg.tie_embeddings:
        model.tie_embeddings()
    return model
