"""RNN encoder-decoder with attention (Bahdanau et al. 2015; Luong et al. 2015), as in the
lecture notes (papers/nmt_architectures_lecture.md, "RNN + Attention Recap").

* Encoder: embeddings, then a bidirectional GRU or LSTM over the packed source
  (``pack_padded_sequence``), so padding never enters the recurrence; each direction has
  hidden_size/2 units and the annotation h_j = [h_j->; h_j<-] has hidden_size.
* Bridge: the decoder starts from s_0 = tanh(W_b [h_n->; h_1<-] + b) (after Bahdanau's initial
  state, which reads the backward state h_1<- alone; one block of W_b per decoder layer; the LSTM
  memory cell gets its own bridge), or from zeros.
* Decoder (Luong's global attention with input feeding): at step t
    s_t   = RNN(s_{t-1}, [E y_{t-1}; a~_{t-1}])     input feeding: the previous attentional vector
    alpha = softmax_j score(s_t, h_j)                padded j masked
    c_t   = sum_j alpha_tj h_j
    a~_t  = tanh(W_c [c_t; s_t])                     the attentional vector
    p(y_t | y_<t, x) = softmax(W_o a~_t + b_o)       ``out_proj``
* Scores (lecture slide "Other ways to compute attention"): dot s^T h; scaled_dot s^T h / sqrt(d);
  general s^T W_a h; additive v^T tanh(W_q s + W_k h + b) (Bahdanau's MLP). The slide's "local"
  score a(s) = W_a s (Luong's location-based attention, blind to the source) is not offered.

Choices the sources leave open, made here: the query is the current top decoder state s_t for
every score (Luong), not s_{t-1}; dropout is applied to embeddings, between stacked layers
(encoder and decoder, as explicit ``nn.Dropout`` modules rather than the RNN's built-in
inter-layer dropout) and to the attentional vector before the output layer; weights keep
PyTorch's default initialisation. ``decode`` runs the same per-step function as ``step`` over the
target (input feeding makes every step depend on the previous one), so the two agree exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from cometnmt.errors import ConfigError
from cometnmt.models.base import Seq2Seq, State
from cometnmt.modules.attention import KeepsWeights
from cometnmt.modules.dropout import Dropout
from cometnmt.modules.output import VocabProjection


@dataclass
class RNNConfig:
    """Hyper-parameters of the RNN encoder-decoder (``model.rnn.*``). Defaults: the Multi30k preset."""

    cell: Literal["gru", "lstm"] = "gru"  # gru or lstm, encoder and decoder
    embed_dim: int = 256  # source and target token embeddings
    hidden_size: int = 512  # decoder state and encoder annotation size (hidden_size/2 per direction)
    enc_layers: int = 1  # stacked bidirectional encoder layers
    dec_layers: int = 1  # stacked decoder cells
    attention: Literal["dot", "scaled_dot", "general", "additive"] = "additive"  # score: dot, scaled_dot, general (Luong) or additive (Bahdanau)
    dropout: float = 0.3  # on embeddings, between stacked layers and on the attentional vector before out_proj
    input_feeding: bool = True  # the previous attentional vector joins the decoder input (Luong); false: the embedding alone
    bridge: bool = True  # the decoder starts from tanh(W_b [encoder final states]); false: from zeros

    def __post_init__(self) -> None:
        for name in ("embed_dim", "hidden_size", "enc_layers", "dec_layers"):
            if getattr(self, name) < 1:
                raise ConfigError.at(f"model.rnn.{name}", f"must be at least 1, got {getattr(self, name)}")
        if self.hidden_size % 2:
            raise ConfigError.at("model.rnn.hidden_size",
                                 f"must be even (each encoder direction has half), got {self.hidden_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError.at("model.rnn.dropout", f"{self.dropout} must be in [0, 1)")


class Encoder(nn.Module):
    """Bidirectional GRU/LSTM stack over packed sequences -> annotations B,S,H and final states."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden_size: int, layers: int, cell: str, dropout: float, pad_id: int) -> None:
        super().__init__()
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.dropout = Dropout(dropout)
        self.layers = nn.ModuleList(
            rnn(embed_dim if i == 0 else hidden_size, hidden_size // 2, batch_first=True, bidirectional=True)
            for i in range(layers)
        )
        self.is_lstm = cell == "lstm"

    def forward(self, src: torch.Tensor, pad_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """-> annotations B,S,H (zero at padding), final h B,H and (LSTM) final c B,H of the top layer."""
        S = src.size(1)
        lengths = (~pad_mask).sum(dim=1).clamp(min=1).cpu()  # B (an empty source reads one pad token)
        x = self.embed(src)  # B,S,E
        for rnn in self.layers:
            packed = pack_padded_sequence(self.dropout(x), lengths, batch_first=True, enforce_sorted=False)
            out, final = rnn(packed)
            x, _ = pad_packed_sequence(out, batch_first=True, total_length=S)  # B,S,H
        h, c = final if self.is_lstm else (final, None)  # 2,B,H/2 each
        join = lambda t: torch.cat([t[0], t[1]], dim=-1)  # forward last, backward first -> B,H
        return x, join(h), (join(c) if c is not None else None)


class Attention(KeepsWeights, nn.Module):
    """score(s, h_j) of one kind, softmax over real source positions, context B,H.

    Keys are prepared once per sentence (``prepare_keys``): h_j for dot and scaled_dot, W_a h_j for
    general, W_k h_j for additive.
    """

    def __init__(self, kind: str, hidden_size: int) -> None:
        super().__init__()
        self.kind = kind
        self.scale = 1.0 / math.sqrt(hidden_size) if kind == "scaled_dot" else 1.0
        if kind in ("general", "additive"):
            self.key_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        if kind == "additive":
            self.query_proj = nn.Linear(hidden_size, hidden_size)
            self.v = nn.Linear(hidden_size, 1, bias=False)

    def prepare_keys(self, annotations: torch.Tensor) -> torch.Tensor:
        if self.kind in ("general", "additive"):
            return self.key_proj(annotations)  # B,S,H
        return annotations  # B,S,H

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """query B,H; keys B,S,H; values B,S,H; bias B,S (0, or -inf at padding) -> context B,H."""
        if self.kind == "additive":
            scores = self.v(torch.tanh(keys + self.query_proj(query).unsqueeze(1))).squeeze(-1)  # B,S
        else:
            scores = torch.bmm(keys, query.unsqueeze(-1)).squeeze(-1) * self.scale  # B,S
        alpha = torch.softmax((scores + bias).float(), dim=-1).type_as(scores)  # B,S
        if self.keep_weights:
            self.keep(alpha[:, None, None, :])  # B,1,1,S: one target position per call
        return torch.bmm(alpha.unsqueeze(1), values).squeeze(1)  # B,H


class RNNSeq2Seq(Seq2Seq):
    """Bidirectional RNN encoder, attentional RNN decoder with input feeding; :class:`Seq2Seq`.

    memory: ``out`` annotations B,S,H, ``pad_mask`` B,S, ``final`` (and LSTM ``final_c``) B,H.
    state: ``hidden`` (and LSTM ``cell``) B,L,H per decoder layer, ``att`` the previous
    attentional vector B,H, and the attention memory (``keys``, ``values``, ``bias``) -- all
    batch-first, so the generic :meth:`Seq2Seq.reorder` applies.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        cell: str,
        embed_dim: int,
        hidden_size: int,
        enc_layers: int,
        dec_layers: int,
        attention: str,
        dropout: float,
        input_feeding: bool,
        bridge: bool,
    ) -> None:
        super().__init__(pad_id)
        H = hidden_size
        self.is_lstm, self.input_feeding, self.hidden_size, self.dec_layers = cell == "lstm", input_feeding, H, dec_layers
        self.encoder = Encoder(src_vocab_size, embed_dim, H, enc_layers, cell, dropout, pad_id)
        self.bridge_h = nn.Linear(H, dec_layers * H) if bridge else None
        self.bridge_c = nn.Linear(H, dec_layers * H) if bridge and self.is_lstm else None
        self.tgt_embed = nn.Embedding(tgt_vocab_size, embed_dim, padding_idx=pad_id)
        rnn_cell = nn.LSTMCell if self.is_lstm else nn.GRUCell
        first_in = embed_dim + H if input_feeding else embed_dim
        self.cells = nn.ModuleList(rnn_cell(first_in if i == 0 else H, H) for i in range(dec_layers))
        self.attention = Attention(attention, H)
        self.combine = nn.Linear(2 * H, H)  # a~_t = tanh(W_c [c_t; s_t])
        self.dropout = Dropout(dropout)
        self.out_proj = VocabProjection(H, tgt_vocab_size)

    # -- encoder side ------------------------------------------------------------------------

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> State:
        out, final, final_c = self.encoder(src, src_pad_mask)  # B,S,H; B,H; B,H or None
        memory = {"out": out, "pad_mask": src_pad_mask, "final": final}
        if final_c is not None:
            memory["final_c"] = final_c
        return memory

    def _bridge(self, layer: nn.Linear | None, final: torch.Tensor) -> torch.Tensor:
        B = final.size(0)
        if layer is None:
            return final.new_zeros(B, self.dec_layers, self.hidden_size)  # B,L,H
        return torch.tanh(layer(final)).view(B, self.dec_layers, self.hidden_size)  # B,L,H

    def init_state(self, memory: State) -> State:
        out, pad_mask = memory["out"], memory["pad_mask"]
        state = {
            "hidden": self._bridge(self.bridge_h, memory["final"]),  # B,L,H
            "att": out.new_zeros(out.size(0), self.hidden_size),  # B,H
            "keys": self.attention.prepare_keys(out),  # B,S,H
            "values": out,  # B,S,H
            "bias": out.new_zeros(pad_mask.shape).masked_fill(pad_mask, float("-inf")),  # B,S
        }
        if self.is_lstm:
            state["cell"] = self._bridge(self.bridge_c, memory["final_c"])  # B,L,H
        return state

    # -- decoder side ------------------------------------------------------------------------

    def _advance(self, embedded: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One decoder step from the (dropped-out) embedding B,E of the previous token ->
        attentional vector B,H and the new state (the given state is not modified)."""
        x = torch.cat([embedded, state["att"]], dim=-1) if self.input_feeding else embedded  # B,E(+H)
        hiddens, cells = [], []
        for i, rnn_cell in enumerate(self.cells):
            if i > 0:
                x = self.dropout(x)
            if self.is_lstm:
                h, c = rnn_cell(x, (state["hidden"][:, i], state["cell"][:, i]))  # B,H each
                cells.append(c)
            else:
                h = rnn_cell(x, state["hidden"][:, i])  # B,H
            hiddens.append(h)
            x = h
        context = self.attention(x, state["keys"], state["values"], state["bias"])  # B,H
        att = torch.tanh(self.combine(torch.cat([context, x], dim=-1)))  # B,H
        new = {**state, "hidden": torch.stack(hiddens, dim=1), "att": att}  # hidden B,L,H
        if self.is_lstm:
            new["cell"] = torch.stack(cells, dim=1)  # B,L,H
        return att, new

    def cross_attention_modules(self) -> list[nn.Module]:
        return [self.attention]  # one attention, after the top layer

    def decode_features(self, tgt_in: torch.Tensor, memory: State) -> torch.Tensor:
        state = self.init_state(memory)
        embedded = self.dropout(self.tgt_embed(tgt_in))  # B,T,E
        outputs = []
        for t in range(tgt_in.size(1)):
            att, state = self._advance(embedded[:, t], state)  # B,H
            outputs.append(att)
        return self.dropout(torch.stack(outputs, dim=1))  # B,T,H

    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        att, state = self._advance(self.dropout(self.tgt_embed(tokens)), state)  # B,H
        return self.out_proj(self.dropout(att)), state  # B,V


def build_rnn(cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> RNNSeq2Seq:
    """The RNN encoder-decoder from ``cfg.rnn`` (a ModelConfig). Reads no shared ModelConfig
    fields: sizes and dropout all come from the ``model.rnn`` section."""
    c = cfg.rnn
    return RNNSeq2Seq(
        src_vocab_size,
        tgt_vocab_size,
        pad_id,
        cell=c.cell,
        embed_dim=c.embed_dim,
        hidden_size=c.hidden_size,
        enc_layers=c.enc_layers,
        dec_layers=c.dec_layers,
        attention=c.attention,
        dropout=c.dropout,
        input_feeding=c.input_feeding,
        bridge=c.bridge,
    )
