"""The baseline Transformer of the COMET paper (section 3; Vaswani et al. 2017).

Post-norm residual units, x' = LayerNorm(x + Dropout(Sublayer(x))); sinusoidal positions (eq. 5);
embeddings scaled by sqrt(d_m); separate source and target embeddings and an untied output layer
(section 3.3); N encoder and N decoder units; FFN_2(x) = W_2 max(0, W_1 x + b_1) + b_2 (eq. 6);
dropout on every sublayer output and on embeddings + positions (section 4.2). Optionally, dropout on
the attention probabilities too (``model.attention_dropout``, 0 by default as in both papers; training only).

The feed-forward sublayer of each unit is pluggable: any module with ``forward(x, pad_mask)`` and
``step(x, cache) -> (y, new_cache)`` fits; a decoder sublayer whose ``wants_source_lengths`` is true
also gets each row's source length (B) as a third argument of both (COMET's per-source-length
decoder batch norm). A sublayer with a ``shared_padding(x, pad_mask, src_lengths)`` method derives
something from the pad mask alone (COMET's masked batch-norm statistics): it gets the result as
``padding=``, computed once a forward by the first unit's (the units of one stack share their
config). What a forward derives once for all the units of a stack (that, the attention mask, the
source lengths) travels to every unit in one :class:`ForwardContext`, so a new such value is one
more field, not one more argument through every unit. Incremental steps never modify the state
they are given. COMET (``comet.py``) plugs its convolution unit into the encoder and, for the
temporal-convolution variant, a causal convolution unit into the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from cometnmt.models.base import Seq2Seq, State, reorder_nested
from cometnmt.modules.attention import MultiHeadAttention, key_mask
from cometnmt.modules.dropout import Dropout
from cometnmt.modules.embeddings import ScaledEmbedding
from cometnmt.modules.output import VocabProjection


class FeedForward(nn.Module):
    """FFN_2 (eq. 6), applied to each position alone, so its incremental step needs no cache.

    ``d_out`` defaults to ``d_model``; COMET's FFN-2 variant maps d_m + 112 features back to d_m.
    """

    def __init__(self, d_model: int, d_ff: int, d_out: Optional[int] = None) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_out or d_model)
        nn.init.xavier_uniform_(self.w1.weight)
        nn.init.xavier_uniform_(self.w2.weight)
        nn.init.zeros_(self.w1.bias)
        nn.init.zeros_(self.w2.bias)

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))  # B,L,D

    def step(self, x: torch.Tensor, cache: dict) -> tuple[torch.Tensor, dict]:
        return self.forward(x), cache  # B,1,D


FFNFactory = Callable[[], nn.Module]
_SOURCE_ONLY = ("cross_k", "cross_v")  # per-unit decoder state that depends on the source sentence alone


@dataclass
class ForwardContext:
    """What one forward of a stack derives once and every unit of the stack reads (``encode`` and
    ``decode`` build it with :meth:`Transformer.context`): built once a forward, not once a unit,
    and passed as one argument, so a new per-forward value is a field here, not another parameter
    of every unit's ``forward``. Incremental decoding keeps its per-source values in the state."""

    pad_mask: Optional[torch.Tensor]  # B,L: the stack's own positions, True = padding (None: none)
    source_mask: Optional[torch.Tensor]  # B,1,1,S: key_mask of the source's pad mask (None: unpadded)
    padding: Any = None  # the FFN's shared_padding of pad_mask (None where it has none)
    src_lengths: Optional[torch.Tensor] = None  # B: real source lengths, decoder only, if its FFN wants them


class EncoderUnit(nn.Module):
    """x' = LN(x + SelfAttn(x)); y = LN(x' + FFN(x')) (section 3.4)."""

    def __init__(self, d_model: int, n_heads: int, ffn: nn.Module, dropout: float, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = ffn
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x B,S,D; ``ctx``: the source's pad mask, its attention mask and the FFN's padding."""
        x = self.norm1(x + self.dropout(self.self_attn(x, x, ctx.pad_mask, attn_mask=ctx.source_mask)))  # B,S,D
        h = self.ffn(x, ctx.pad_mask) if ctx.padding is None else self.ffn(x, ctx.pad_mask, padding=ctx.padding)
        return self.norm2(x + self.dropout(h))  # B,S,D


class DecoderUnit(nn.Module):
    """Masked self-attention, attention over the encoder output, then FFN; post-norm (section 3.5)."""

    def __init__(self, d_model: int, n_heads: int, ffn: nn.Module, dropout: float, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = ffn
        self.ffn_wants_source_lengths = bool(getattr(ffn, "wants_source_lengths", False))
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x B,T,D over memory B,S,D; ``ctx``: the target's pad mask, the source's attention mask,
        and for the FFN its padding and (only if it wants them) the source lengths."""
        # Targets are right-padded, so the causal mask alone keeps padding out of real positions.
        x = self.norm1(x + self.dropout(self.self_attn(x, x, None, causal=True)))  # B,T,D
        x = self.norm2(x + self.dropout(self.cross_attn(x, memory, attn_mask=ctx.source_mask)))  # B,T,D
        args = (x, ctx.pad_mask, ctx.src_lengths) if self.ffn_wants_source_lengths else (x, ctx.pad_mask)
        h = self.ffn(*args) if ctx.padding is None else self.ffn(*args, padding=ctx.padding)
        return self.norm3(x + self.dropout(h))  # B,T,D

    def step(self, x: torch.Tensor, cache: dict, memory_mask: torch.Tensor, group: int = 1,
             src_lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict]:
        """x B,1,D; cache holds this unit's self-attention keys/values, cross keys/values (one entry
        per ``group`` consecutive rows), FFN state; ``src_lengths`` (B, one per row) for an FFN that
        wants them.

        Eval-only (no dropout). Returns the output B,1,D and a new cache."""
        h, self_cache = self.self_attn.step(x, cache["self"])
        x = self.norm1(x + h)  # B,1,D
        x = self.norm2(x + self.cross_attn.attend_grouped(x, cache["cross_k"], cache["cross_v"], memory_mask, group))
        h, ffn_cache = (self.ffn.step(x, cache["ffn"], src_lengths) if self.ffn_wants_source_lengths
                        else self.ffn.step(x, cache["ffn"]))
        return self.norm3(x + h), {**cache, "self": self_cache, "ffn": ffn_cache}  # B,1,D


class Transformer(Seq2Seq):
    """Encoder-decoder Transformer implementing the :class:`Seq2Seq` protocol."""

    unpadded_source_as_none = True  # attention takes no mask; COMET's batch norm handles None

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        d_model: int,
        n_heads: int,
        enc_layers: int,
        dec_layers: int,
        dropout: float,
        max_positions: int,
        encoder_ffn: FFNFactory,
        decoder_ffn: FFNFactory,
        attention_dropout: float = 0.0,
    ) -> None:
        super().__init__(pad_id)
        self.src_embed = ScaledEmbedding(src_vocab_size, d_model, pad_id, max_positions, dropout)
        self.tgt_embed = ScaledEmbedding(tgt_vocab_size, d_model, pad_id, max_positions, dropout)
        self.encoder = nn.ModuleList(EncoderUnit(d_model, n_heads, encoder_ffn(), dropout, attention_dropout) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(DecoderUnit(d_model, n_heads, decoder_ffn(), dropout, attention_dropout) for _ in range(dec_layers))
        self.out_proj = VocabProjection(d_model, tgt_vocab_size)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    @staticmethod
    def context(units: nn.ModuleList, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                src_pad_mask: Optional[torch.Tensor], src_lengths: Optional[torch.Tensor] = None) -> ForwardContext:
        """The :class:`ForwardContext` of one forward of ``units`` (the encoder or the decoder) over
        x B,L,D with pad_mask B,L, attending to a source with src_pad_mask B,S (the same mask, for
        the encoder): the attention mask and the FFNs' padding derived here, once for all the units."""
        padding = _shared_padding(units, x, pad_mask, src_lengths)
        return ForwardContext(pad_mask, key_mask(src_pad_mask), padding, src_lengths)  # key mask B,1,1,S

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> State:
        x = self.src_embed(src)  # B,S,D
        ctx = self.context(self.encoder, x, src_pad_mask, src_pad_mask)
        for unit in self.encoder:
            x = unit(x, ctx)  # B,S,D
        return {"out": x, "pad_mask": src_pad_mask}

    def cross_attention_modules(self) -> list[nn.Module]:
        return [unit.cross_attn for unit in self.decoder]

    def _wants_source_lengths(self) -> bool:
        return any(unit.ffn_wants_source_lengths for unit in self.decoder)

    @staticmethod
    def _source_lengths(memory: State) -> torch.Tensor:
        """B real source lengths (long) from the encoder state; its pad mask is None when unpadded."""
        out, pad_mask = memory["out"], memory["pad_mask"]
        if pad_mask is None:  # a fill: no host-to-device copy
            return torch.full((out.size(0),), out.size(1), dtype=torch.long, device=out.device)
        return (~pad_mask).sum(dim=1)

    def decode_features(self, tgt_in: torch.Tensor, memory: State) -> torch.Tensor:
        tgt_pad_mask = tgt_in.eq(self.pad_id)  # B,T
        src_lengths = self._source_lengths(memory) if self._wants_source_lengths() else None
        x = self.tgt_embed(tgt_in)  # B,T,D
        ctx = self.context(self.decoder, x, tgt_pad_mask, memory["pad_mask"], src_lengths)
        for unit in self.decoder:
            x = unit(x, memory["out"], ctx)  # B,T,D
        return x

    def init_state(self, memory: State) -> State:
        units = []
        for unit in self.decoder:
            k, v = unit.cross_attn.project_kv(memory["out"])  # B,H,S,D/H each
            units.append({"cross_k": k, "cross_v": v, "self": {}, "ffn": {}})
        src_row = torch.arange(memory["out"].size(0), device=memory["out"].device)  # B: the source each row reads
        state = {"units": units, "memory_mask": key_mask(memory["pad_mask"]), "pos": 0, "src_row": src_row, "group": 1}
        if self._wants_source_lengths():  # one per source, like the memory mask
            state["src_lengths"] = self._source_lengths(memory)
        return state

    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        x = self.tgt_embed(tokens[:, None], offset=state["pos"])  # B,1,D
        src_lengths = state.get("src_lengths")  # like the memory mask: one entry per `group` consecutive rows
        if src_lengths is not None and state.get("group", 1) > 1:
            src_lengths = src_lengths.repeat_interleave(state["group"])  # B
        units = []
        for unit, cache in zip(self.decoder, state["units"]):
            x, cache = unit.step(x, cache, state["memory_mask"], state.get("group", 1), src_lengths)  # B,1,D
            units.append(cache)
        state = {**state, "units": units, "pos": state["pos"] + 1}
        return self.out_proj(x[:, 0]), state  # B,V

    def tie_embeddings(self) -> None:
        """One V,D matrix for the target embeddings and the output projection's weight (its bias
        stays its own). The matrix keeps the embedding's initialisation, N(0, 1/d_model), under which
        the embedding's sqrt(d_model) scale gives unit-variance inputs (Vaswani et al. 2017, 3.4)."""
        self.out_proj.weight = self.tgt_embed.embed.weight

    def reorder(self, state: State, index: torch.Tensor) -> State:
        """Keep/duplicate batch rows.

        The cross-attention keys and values and the memory mask depend on the source sentence
        alone, and they are most of the state, so they are kept once per source, never copied per
        row: ``src_row`` says which source each row reads. Beam search reshuffles hypotheses among
        the rows of one sentence (sources unchanged: nothing source-side is touched), duplicates
        each sentence into K consecutive rows (then ``group`` = K and the K queries of a sentence
        attend together, ``MultiHeadAttention.attend_grouped``) and drops finished sentences (the
        source side keeps the remaining sources). Any other pattern copies the source side per row.
        """
        src_row = state.get("src_row")
        if src_row is None:
            return reorder_nested(state, index)
        new_src = src_row.index_select(0, index)
        if torch.equal(new_src, src_row):  # hypotheses reshuffled within their sentences
            source, group = (lambda t: t), state["group"]  # noqa: E731
        else:
            used, counts = torch.unique_consecutive(new_src, return_counts=True)
            group = int(counts[0])
            if bool((counts == group).all()) and (used.numel() == 1 or bool((used[1:] > used[:-1]).all())):
                # blocks of `group` rows per source, sources in order: keep the sources still read
                same = used.numel() == state["units"][0]["cross_k"].size(0)
                source = (lambda t: t) if same else (lambda t: t.index_select(0, used))  # noqa: E731
                src_row = torch.arange(used.numel(), device=index.device).repeat_interleave(group)
            else:  # any other pattern: one copy of the source side per row
                source, group = (lambda t: t.index_select(0, new_src)), 1  # noqa: E731
                src_row = torch.arange(index.numel(), device=index.device)
        units = [
            {**reorder_nested({k: v for k, v in u.items() if k not in _SOURCE_ONLY}, index),
             **{k: source(u[k]) for k in _SOURCE_ONLY}}
            for u in state["units"]
        ]
        reordered = {**state, "units": units, "memory_mask": source(state["memory_mask"]), "src_row": src_row, "group": group}
        if "src_lengths" in state:
            reordered["src_lengths"] = source(state["src_lengths"])
        return reordered


def _shared_padding(units: nn.ModuleList, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                    src_lengths: Optional[torch.Tensor] = None) -> Any:
    """What the units' FFNs derive from the pad mask alone, by the first one's ``shared_padding``
    (None where it has none): one config and mode for the stack, so one result for all of them."""
    first = units[0].ffn if len(units) else None
    if not hasattr(first, "shared_padding"):
        return None
    if getattr(first, "wants_source_lengths", False):
        return first.shared_padding(x, pad_mask, src_lengths)
    return first.shared_padding(x, pad_mask)


def transformer_from_config(
    cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, encoder_ffn: FFNFactory, decoder_ffn: FFNFactory
) -> Transformer:
    """A Transformer sized by a ModelConfig, with the given feed-forward sublayers."""
    return Transformer(
        src_vocab_size,
        tgt_vocab_size,
        pad_id,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        enc_layers=cfg.enc_layers,
        dec_layers=cfg.dec_layers,
        dropout=cfg.dropout,
        max_positions=cfg.max_positions,
        encoder_ffn=encoder_ffn,
        decoder_ffn=decoder_ffn,
        attention_dropout=cfg.attention_dropout,
    )


def build_transformer(cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> Transformer:
    """The paper's baseline: FFN_2 in every encoder and decoder unit. ``cfg`` is a ModelConfig."""
    ffn = lambda: FeedForward(cfg.d_model, cfg.d_ff)  # noqa: E731
    return transformer_from_config(cfg, src_vocab_size, tgt_vocab_size, pad_id, ffn, ffn)
