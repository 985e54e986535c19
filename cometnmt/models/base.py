"""The protocol every architecture implements, so that training and search never name one.

    memory = model.encode(src, src_pad_mask)      # whole source, once
    logits = model.decode(tgt_in, memory)         # training: whole target prefix, teacher forcing
    hidden = model.decode_features(tgt_in, memory)  # the same, before the output layer model.out_proj
    state  = model.init_state(memory)             # search: start incremental decoding
    logits, state = model.step(tokens, state)     # one target position, using cached state
    state  = model.reorder(state, index)          # beam search: reselect/duplicate batch rows

``memory`` and ``state`` are plain (nested) dicts whose tensors have the batch on dim 0, so the
default :meth:`Seq2Seq.reorder` is a generic ``index_select`` and architectures rarely override it.
Masks follow one convention everywhere: ``pad_mask`` is True at padding.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

State = dict[str, Any]


def reorder_nested(value: Any, index: torch.Tensor) -> Any:
    """index_select dim 0 of every tensor in a nested dict/list; other values pass through."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, index) if value.dim() > 0 else value
    if isinstance(value, dict):
        return {k: reorder_nested(v, index) for k, v in value.items()}
    if isinstance(value, list):
        return [reorder_nested(v, index) for v in value]
    return value


class Seq2Seq(nn.Module):
    """Base class of all translation models. Subclasses implement the five protocol methods.

    ``unpadded_source_as_none``: True where ``forward`` and ``encode`` take ``src_pad_mask=None``
    for a batch without source padding and compute the same as with an all-False mask. The trainer
    then passes None for such batches (most of them: training batches are cut from one source
    length), so attention runs without a mask and COMET's batch norm as PyTorch's own kernel; the
    trainer knows it from the batch's token count, without waiting on the GPU.
    """

    unpadded_source_as_none = False

    def __init__(self, pad_id: int) -> None:
        super().__init__()
        self.pad_id = pad_id

    def position_limit(self) -> Optional[int]:
        """The longest sequence (source, or target with its BOS) the model's position tables cover:
        the smallest ``positions`` table among its modules (sinusoidal buffer or learned
        embedding); None when it has none (the RNN)."""
        sizes = []
        for module in self.modules():
            table = getattr(module, "positions", None)
            if isinstance(table, nn.Embedding):
                sizes.append(table.num_embeddings)
            elif isinstance(table, torch.Tensor):
                sizes.append(table.size(0))
        return min(sizes, default=None)

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> State:
        """src B,S long; src_pad_mask B,S bool -> memory dict (tensors batch-first)."""
        raise NotImplementedError

    def decode(self, tgt_in: torch.Tensor, memory: State) -> torch.Tensor:
        """tgt_in B,T long (BOS + prefix) -> logits B,T,V. Position t sees only tgt_in[:, :t+1]."""
        return self.out_proj(self.decode_features(tgt_in, memory))

    def decode_features(self, tgt_in: torch.Tensor, memory: State) -> torch.Tensor:
        """What :meth:`decode` feeds the output layer ``self.out_proj`` (an ``nn.Linear`` onto the
        target vocabulary): B,T,D_out. The trainer's CPU loss takes these and the layer's weights
        (:func:`cometnmt.training.loss.linear_cross_entropy`), without forming the B,T,V logits."""
        raise NotImplementedError

    def init_state(self, memory: State) -> State:
        """Start incremental decoding from an encoded batch."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """tokens B long (the last emitted token) -> logits B,V for the next position, new state."""
        raise NotImplementedError

    def reorder(self, state: State, index: torch.Tensor) -> State:
        """Keep/duplicate batch rows of the state (index: long, new batch size)."""
        return reorder_nested(state, index)

    def forward(self, src: torch.Tensor, src_pad_mask: torch.Tensor, tgt_in: torch.Tensor, features_only: bool = False) -> torch.Tensor:
        """Training entry point: logits B,T,V, or with ``features_only`` what the output layer would
        take (:meth:`decode_features`); the hook for DDP/compile wrappers."""
        memory = self.encode(src, src_pad_mask)
        return self.decode_features(tgt_in, memory) if features_only else self.decode(tgt_in, memory)

    def extra_losses(self) -> dict[str, tuple[torch.Tensor, float]]:
        """Auxiliary losses of the last forward as ``name -> (mean loss, weight)`` (e.g.
        Transformer++ POS/NER tags). The trainer adds ``weight * loss`` to the objective, each
        micro-batch's weighed by its share of the step's tokens (target tokens; for a tag task of
        ``Examples.src_tags``, its labelled source tokens, which the mean is over), and logs each as
        ``loss_<name>``. None by default."""
        return {}

    def training_source_mask(self, batch) -> Optional[torch.Tensor]:
        """The ``src_pad_mask`` to train a collated batch on: None for a batch without source
        padding where the model is ``unpadded_source_as_none``, else the batch's own. Decided from
        host numbers (the batch's token count), so it never waits on the GPU."""
        if self.unpadded_source_as_none and batch.n_src_tokens == batch.src.numel():
            return None
        return batch.src_pad_mask

    def cross_attention_modules(self) -> list[nn.Module]:
        """The decoder's attention over the source, one module per decoder layer in order (modules
        with :class:`cometnmt.modules.attention.KeepsWeights`)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its attention over the source")

    @torch.no_grad()
    def cross_attention(self, src: torch.Tensor, src_pad_mask: torch.Tensor, tgt_in: torch.Tensor) -> list[torch.Tensor]:
        """Teacher-forced attention of each target position over the source, per decoder layer:
        B,H,T,S weights (H heads; 1 for the RNN and ConvS2S), rows summing to 1 over the real
        source positions (0 at padding). Run it in eval mode; the forward is the model's own, with
        the attention weights written out where a fused kernel would not form them."""
        modules = self.cross_attention_modules()
        for m in modules:
            m.keep_weights, m.kept = True, []
        try:
            self.decode(tgt_in, self.encode(src, src_pad_mask))
            return [torch.cat(m.kept, dim=2) for m in modules]  # the RNN keeps one position per call
        finally:
            for m in modules:
                del m.keep_weights, m.kept  # back to the class default: keep nothing

    def num_parameters(self) -> int:
        """Trainable numbers; a matrix two modules share (``tie_embeddings``) counts once."""
        return sum(p.numel() for p in self.parameters())

    def tie_embeddings(self) -> None:
        """Make the output projection use the target embedding matrix (``model.tie_embeddings``)."""
        raise NotImplementedError(f"{type(self).__name__} has no tied target embeddings")
