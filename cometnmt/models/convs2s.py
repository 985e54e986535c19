"""ConvS2S: Convolutional Sequence to Sequence Learning (Gehring et al. 2017), as fairseq's
``fconv`` implements it and the JoeyNMT port (papers/convs2s_in_joeynmt.md) follows.

* Embeddings (section 3.1): e_j = w_j + p_j, learned token and learned position embeddings
  (both N(0, 0.1)), dropout on the sum.
* Blocks (section 3.2): a linear map from the embedding size f to the convolution width d, then
  layers  h' = (GLU(conv_k(dropout(h))) + h) * sqrt(0.5), where GLU(A; B) = A ⊙ sigmoid(B) halves
  the 2d channels of a width-k convolution; a linear residual projection where d changes between
  layers; a linear map back to f at the top.
* Encoder: "same" padding, (k-1)//2 zeros left and k//2 right, so the output keeps the length.
  Padded positions are zeroed before every convolution, so padding never leaks into real
  positions: a sentence encodes identically alone or inside a padded batch.
* Decoder: k-1 zeros on the left only, so position t sees inputs t-k+1 .. t (causal).
* Multi-step attention in every decoder layer (section 3.3):
    d_i  = (W_d h_i + b_d + g_i) * sqrt(0.5)         h_i: GLU output, g_i: target embedding
    a_ij = softmax_j(d_i · z_j)                      z_j: encoder output (keys), padded j masked
    c_i  = sum_j a_ij (z_j + e_j) * sqrt(0.5)         values: encoder output + source embedding
    c_i <- c_i * s * sqrt(1/s)                        s: the real length of that source sentence
    h_i <- (W_c c_i + b_c + h_i) * sqrt(0.5)           back to the convolution width
* Output: the top decoder state mapped to ``out_embed_dim``, dropout, then the vocabulary
  projection ``out_proj``.
* Initialisation and normalisation (section 3.4; fairseq): every linear and convolution is weight
  normalised; linears drawn from N(0, sqrt((1-p)/n_in)) (p = dropout where the input was dropped
  out, else 0), convolutions feeding a GLU from N(0, sqrt(4(1-p)/(k n_in))), biases zero.
  Gradients reaching the encoder through the attention are scaled down by the number of
  attention layers m (section 3.4), as fairseq by 1/(2m) (``scale_encoder_grad``).

Incremental decoding keeps, for every decoder layer, a window of its last k-1 inputs, so one
step costs O(k) convolution work however long the prefix is (fairseq's LinearizedConvolution:
the kernel flattened into one matrix product). The weight-normalised matrices are evaluated once
per search (``init_state``) rather than at every step.

Choices the papers leave open, made here: positions count from 0 (fairseq starts after its
padding index); padded keys are also zeroed in the encoder output (as later fairseq); targets
are right-padded, so the causal convolutions keep target padding out of real positions without
a mask; every dropout is an ``nn.Dropout`` module (embeddings, each convolution's input, the
decoder output before ``out_proj``).

Where the JoeyNMT write-up's words differ from what it (and Gehring et al., and fairseq) build,
this follows the build: positions are added to the token embeddings, not concatenated; the GLU
gates (A ⊙ sigmoid(B)) rather than adds; the top decoder state reaches the vocabulary through two
linears (``out_embed_dim`` between). The port leaves out the encoder gradient scaling; here it is
on, as in the paper and fairseq (``scale_encoder_grad: false`` gives the port's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from cometnmt.errors import ConfigError
from cometnmt.models.base import Seq2Seq, State, reorder_nested
from cometnmt.modules.attention import KeepsWeights
from cometnmt.modules.dropout import Dropout

SQRT_HALF = math.sqrt(0.5)


@dataclass
class ConvS2SConfig:
    """Hyper-parameters of ConvS2S (``model.convs2s.*``). Defaults: the Multi30k preset.

    A layer spec is a list of ``[channels, kernel_width]`` or ``[channels, kernel_width, repeat]``
    entries, read in order: ``[[512, 3, 9], [1024, 3, 4]]`` is fairseq's
    ``[(512, 3)] * 9 + [(1024, 3)] * 4``.
    """

    embed_dim: int = 256  # f: token/position embeddings, attention keys and values
    enc_layers: list[list[int]] = field(default_factory=lambda: [[512, 3, 10]])  # [channels, kernel_width(, repeat)] entries, in order
    dec_layers: list[list[int]] = field(default_factory=lambda: [[512, 3, 10]])  # as enc_layers; every decoder layer attends
    out_embed_dim: int = 256  # decoder output before the vocabulary projection
    dropout: float = 0.25  # on embeddings, each convolution's input and the decoder output before out_proj
    max_positions: int = 1024  # learned position embeddings: longest sentence + 1 (target BOS)
    scale_encoder_grad: bool = True  # encoder gradient / (2 * decoder attention layers)

    def __post_init__(self) -> None:
        for name in ("embed_dim", "out_embed_dim", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError.at(f"model.convs2s.{name}", f"must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError.at("model.convs2s.dropout", f"{self.dropout} must be in [0, 1)")
        expand_layers(self.enc_layers, "model.convs2s.enc_layers")
        expand_layers(self.dec_layers, "model.convs2s.dec_layers")


def expand_layers(spec: list[list[int]], key: str) -> list[tuple[int, int]]:
    """``[[C, K(, R)], ...]`` -> one (channels, kernel_width) pair per layer; ConfigError if malformed."""
    layers: list[tuple[int, int]] = []
    for i, entry in enumerate(spec):
        if len(entry) not in (2, 3) or any(v < 1 for v in entry):
            raise ConfigError.at(
                f"{key}[{i}]", "expected [channels, kernel_width] or [channels, kernel_width, repeat] "
                f"of positive integers, got {entry}"
            )
        repeat = entry[2] if len(entry) == 3 else 1
        layers += [(entry[0], entry[1])] * repeat
    if not layers:
        raise ConfigError.at(key, "needs at least one layer")
    return layers


# ---------------------------------------------------------------------------------------------
# Parts, initialised as fairseq's fconv


def wn_linear(d_in: int, d_out: int, dropout: float = 0.0) -> nn.Linear:
    """Weight-normalised linear, W ~ N(0, sqrt((1 - dropout) / d_in)), b = 0."""
    m = nn.Linear(d_in, d_out)
    nn.init.normal_(m.weight, mean=0.0, std=math.sqrt((1.0 - dropout) / d_in))
    nn.init.zeros_(m.bias)
    return weight_norm(m)


def wn_conv(d_in: int, d_out: int, kernel_size: int, dropout: float) -> nn.Conv1d:
    """Weight-normalised convolution feeding a GLU, W ~ N(0, sqrt(4 (1 - dropout) / (k d_in))).
    The module holds the kernel 2C_out,C_in,k and its normalisation; :class:`ConvGLU` pads and
    applies it as a matrix product rather than calling the module."""
    m = nn.Conv1d(d_in, d_out, kernel_size)
    nn.init.normal_(m.weight, mean=0.0, std=math.sqrt(4.0 * (1.0 - dropout) / (kernel_size * d_in)))
    nn.init.zeros_(m.bias)
    return weight_norm(m, dim=0)  # one norm per output channel


class GradMultiply(torch.autograd.Function):
    """Identity forward; gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class LearnedEmbedding(nn.Module):
    """w_j + p_j with learned token and position tables, N(0, 0.1), then dropout (section 3.1)."""

    def __init__(self, vocab_size: int, embed_dim: int, pad_id: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.positions = nn.Embedding(max_positions, embed_dim)
        nn.init.normal_(self.tokens.weight, mean=0.0, std=0.1)
        nn.init.normal_(self.positions.weight, mean=0.0, std=0.1)
        with torch.no_grad():
            self.tokens.weight[pad_id].zero_()
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = tokens.size(1)
        if offset + length > self.positions.num_embeddings:
            raise ValueError(
                f"sequence of length {offset + length} exceeds model.convs2s.max_positions={self.positions.num_embeddings}"
            )
        pos = torch.arange(offset, offset + length, device=tokens.device)  # L
        return self.dropout(self.tokens(tokens) + self.positions(pos))  # B,L,E


class ConvGLU(nn.Module):
    """dropout -> width-k convolution to 2*C_out channels -> GLU, on B,L,C inputs.

    ``pad`` is (left, right) zeros: ((k-1)//2, k//2) for the encoder, (k-1, 0) for the decoder.
    The convolution is one matrix product of the unfolded input windows with the kernel flattened
    to 2C_out, C_in*k, as fairseq's ConvTBC and LinearizedConvolution (faster than a convolution
    call for small kernels); the incremental step is the same product on a single window.
    """

    def __init__(self, c_in: int, c_out: int, kernel_size: int, dropout: float, pad: tuple[int, int]) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        self.conv = wn_conv(c_in, 2 * c_out, kernel_size, dropout)
        self.pad = pad
        self.kernel_size = kernel_size

    def flat_weight(self) -> torch.Tensor:
        """The weight-normalised kernel as one matrix 2C_out, C_in*k (a view)."""
        weight = self.conv.weight  # 2C_out,C_in,k
        return weight.view(weight.size(0), -1)

    def apply(self, padded: torch.Tensor, flat_weight: torch.Tensor) -> torch.Tensor:
        """padded B,L+k-1,C_in -> GLU(conv) B,L,C_out (no padding added here)."""
        windows = padded.unfold(1, self.kernel_size, 1)  # B,L,C_in,k (a view)
        h = F.linear(windows.flatten(2), flat_weight, self.conv.bias)  # B,L,2C_out
        return F.glu(h, dim=-1)  # B,L,C_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x B,L,C_in -> B,L,C_out."""
        padded = F.pad(self.dropout(x), (0, 0, *self.pad))  # B,L+k-1,C_in
        return self.apply(padded, self.flat_weight())

    def step(self, x: torch.Tensor, history: torch.Tensor, flat_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal only: x B,1,C_in and the last k-1 inputs B,k-1,C_in -> B,1,C_out and the new history."""
        window = torch.cat([history, x], dim=1)  # B,k,C_in
        return self.apply(window, flat_weight), window[:, 1:]  # B,1,C_out


class EncoderLayer(nn.Module):
    """h' = (GLU(conv(mask(h))) + residual(h)) * sqrt(0.5), "same" padding."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.residual = wn_linear(c_in, c_out) if c_in != c_out else None
        self.conv = ConvGLU(c_in, c_out, kernel_size, dropout, ((kernel_size - 1) // 2, kernel_size // 2))

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        residual = x if self.residual is None else self.residual(x)  # B,S,C_out
        h = self.conv(x.masked_fill(pad_mask.unsqueeze(-1), 0.0))  # B,S,C_out
        return (h + residual) * SQRT_HALF


class MultiStepAttention(KeepsWeights, nn.Module):
    """One decoder layer's attention over the encoder (section 3.3); B,T,C -> B,T,C.

    ``mem`` holds keys B,S,E, values B,S,E, ``bias`` B,1,S (0 or -inf at padding) and ``scale``
    B,1,1 (s * sqrt(1/s), s the real source length).
    """

    def __init__(self, channels: int, embed_dim: int) -> None:
        super().__init__()
        self.to_embed = wn_linear(channels, embed_dim)
        self.to_conv = wn_linear(embed_dim, channels)

    def forward(self, h: torch.Tensor, target_embed: torch.Tensor, mem: State, weights: Optional[dict] = None) -> torch.Tensor:
        """``weights``: the projections' weight matrices, precomputed (incremental decoding)."""
        w_embed, w_conv = (self.to_embed.weight, self.to_conv.weight) if weights is None else (weights["to_embed"], weights["to_conv"])
        query = (F.linear(h, w_embed, self.to_embed.bias) + target_embed) * SQRT_HALF  # B,T,E
        scores = torch.baddbmm(mem["bias"], query, mem["keys"].transpose(1, 2))  # B,T,S
        attn = torch.softmax(scores.float(), dim=-1).type_as(scores)  # B,T,S
        if self.keep_weights:
            self.keep(attn[:, None])  # B,1,T,S
        context = torch.bmm(attn, mem["values"]) * mem["scale"]  # B,T,E
        return (F.linear(context, w_conv, self.to_conv.bias) + h) * SQRT_HALF  # B,T,C


class DecoderLayer(nn.Module):
    """Causal convolution + GLU, multi-step attention, residual; all scaled by sqrt(0.5)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, embed_dim: int, dropout: float) -> None:
        super().__init__()
        self.residual = wn_linear(c_in, c_out) if c_in != c_out else None
        self.conv = ConvGLU(c_in, c_out, kernel_size, dropout, (kernel_size - 1, 0))
        self.attention = MultiStepAttention(c_out, embed_dim)
        self.c_in, self.context = c_in, kernel_size - 1

    def forward(self, x: torch.Tensor, target_embed: torch.Tensor, mem: State) -> torch.Tensor:
        residual = x if self.residual is None else self.residual(x)  # B,T,C_out
        h = self.attention(self.conv(x), target_embed, mem)  # B,T,C_out
        return (h + residual) * SQRT_HALF

    def step_weights(self) -> dict[str, Optional[torch.Tensor]]:
        """This layer's weight-normalised matrices, evaluated once for a whole search."""
        return {
            "residual": None if self.residual is None else self.residual.weight,
            "conv": self.conv.flat_weight(),
            "to_embed": self.attention.to_embed.weight,
            "to_conv": self.attention.to_conv.weight,
        }

    def step(self, x: torch.Tensor, target_embed: torch.Tensor, history: torch.Tensor, mem: State, weights: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """x B,1,C_in; history B,k-1,C_in (the layer's previous inputs) -> B,1,C_out, new history."""
        residual = x if self.residual is None else F.linear(x, weights["residual"], self.residual.bias)  # B,1,C_out
        h, history = self.conv.step(x, history, weights["conv"])  # B,1,C_out
        h = self.attention(h, target_embed, mem, weights)  # B,1,C_out
        return (h + residual) * SQRT_HALF, history


# ---------------------------------------------------------------------------------------------
# The model


class ConvS2S(Seq2Seq):
    """Convolutional encoder-decoder with multi-step attention implementing :class:`Seq2Seq`.

    memory: ``out`` = encoder output z (attention keys) B,S,E; ``values`` = (z + e) sqrt(0.5)
    B,S,E; ``pad_mask`` B,S. Decoder state: the attention memory, one window B,k-1,C_in per
    layer, the position of the next token and the decoder weights (not batch rows, so
    :meth:`reorder` leaves them alone).
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        embed_dim: int,
        enc_layers: list[tuple[int, int]],
        dec_layers: list[tuple[int, int]],
        out_embed_dim: int,
        dropout: float,
        max_positions: int,
        scale_encoder_grad: bool,
    ) -> None:
        super().__init__(pad_id)
        self.src_embed = LearnedEmbedding(src_vocab_size, embed_dim, pad_id, max_positions, dropout)
        self.tgt_embed = LearnedEmbedding(tgt_vocab_size, embed_dim, pad_id, max_positions, dropout)

        widths = [enc_layers[0][0]] + [c for c, _ in enc_layers]
        self.enc_in = wn_linear(embed_dim, widths[0], dropout)
        self.encoder = nn.ModuleList(EncoderLayer(widths[i], c, k, dropout) for i, (c, k) in enumerate(enc_layers))
        self.enc_out = wn_linear(widths[-1], embed_dim)

        widths = [dec_layers[0][0]] + [c for c, _ in dec_layers]
        self.dec_in = wn_linear(embed_dim, widths[0], dropout)
        self.decoder = nn.ModuleList(
            DecoderLayer(widths[i], c, k, embed_dim, dropout) for i, (c, k) in enumerate(dec_layers)
        )
        self.dec_out = wn_linear(widths[-1], out_embed_dim)
        self.out_dropout = Dropout(dropout)
        self.out_proj = wn_linear(out_embed_dim, tgt_vocab_size, dropout)
        self.encoder_grad_scale = 1.0 / (2.0 * len(dec_layers)) if scale_encoder_grad else 1.0

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> State:
        embedded = self.src_embed(src)  # B,S,E
        x = self.enc_in(embedded)  # B,S,C
        for layer in self.encoder:
            x = layer(x, src_pad_mask)  # B,S,C
        keys = self.enc_out(x).masked_fill(src_pad_mask.unsqueeze(-1), 0.0)  # B,S,E
        if self.encoder_grad_scale != 1.0 and torch.is_grad_enabled():
            keys = GradMultiply.apply(keys, self.encoder_grad_scale)
        values = (keys + embedded) * SQRT_HALF  # B,S,E
        return {"out": keys, "values": values, "pad_mask": src_pad_mask}

    @staticmethod
    def attention_memory(memory: State) -> State:
        """Keys, values, additive key mask and output scale, shared by every decoder layer."""
        pad_mask = memory["pad_mask"]  # B,S
        keys = memory["out"]
        bias = keys.new_zeros(pad_mask.shape).masked_fill(pad_mask, float("-inf")).unsqueeze(1)  # B,1,S
        s = (~pad_mask).sum(dim=1).float().clamp(min=1.0)[:, None, None]  # B,1,1 (float32: exact lengths)
        return {"keys": keys, "values": memory["values"], "bias": bias, "scale": (s * s.rsqrt()).to(keys.dtype)}

    def cross_attention_modules(self) -> list[nn.Module]:
        return [layer.attention for layer in self.decoder]

    def decode_features(self, tgt_in: torch.Tensor, memory: State) -> torch.Tensor:
        mem = self.attention_memory(memory)
        embedded = self.tgt_embed(tgt_in)  # B,T,E
        x = self.dec_in(embedded)  # B,T,C
        for layer in self.decoder:
            x = layer(x, embedded, mem)  # B,T,C
        return self.out_dropout(self.dec_out(x))  # B,T,E

    def init_state(self, memory: State) -> State:
        """The attention memory, zero windows (the decoder's left padding), position 0, and the
        decoder's weights evaluated once: weight normalisation would otherwise recompute every
        matrix from (g, v) at every step (fairseq removes weight norm for generation instead)."""
        mem = self.attention_memory(memory)
        B = mem["keys"].size(0)
        windows = [mem["keys"].new_zeros(B, layer.context, layer.c_in) for layer in self.decoder]  # B,k-1,C_in each
        weights = {
            "dec_in": self.dec_in.weight,
            "dec_out": self.dec_out.weight,
            "out_proj": self.out_proj.weight,
            "layers": [layer.step_weights() for layer in self.decoder],
        }
        return {"mem": mem, "windows": windows, "pos": 0, "weights": weights}

    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        w = state["weights"]
        embedded = self.tgt_embed(tokens[:, None], offset=state["pos"])  # B,1,E
        x = F.linear(embedded, w["dec_in"], self.dec_in.bias)  # B,1,C
        windows = []
        for layer, history, lw in zip(self.decoder, state["windows"], w["layers"]):
            x, history = layer.step(x, embedded, history, state["mem"], lw)  # B,1,C
            windows.append(history)
        x = F.linear(x[:, 0], w["dec_out"], self.dec_out.bias)  # B,out_embed
        logits = F.linear(x, w["out_proj"], self.out_proj.bias)  # B,V
        return logits, {**state, "windows": windows, "pos": state["pos"] + 1}

    def reorder(self, state: State, index: torch.Tensor) -> State:
        """Batch rows of everything but the weights, which are shared by all rows."""
        rows = reorder_nested({k: v for k, v in state.items() if k != "weights"}, index)
        return {**rows, "weights": state["weights"]}


def build_convs2s(cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> ConvS2S:
    """ConvS2S from ``cfg.convs2s`` (a ModelConfig). Reads no shared ModelConfig fields: sizes,
    dropout and max_positions all come from the ``model.convs2s`` section."""
    c = cfg.convs2s
    return ConvS2S(
        src_vocab_size,
        tgt_vocab_size,
        pad_id,
        embed_dim=c.embed_dim,
        enc_layers=expand_layers(c.enc_layers, "model.convs2s.enc_layers"),
        dec_layers=expand_layers(c.dec_layers, "model.convs2s.dec_layers"),
        out_embed_dim=c.out_embed_dim,
        dropout=c.dropout,
        max_positions=c.max_positions,
        scale_encoder_grad=c.scale_encoder_grad,
    )
