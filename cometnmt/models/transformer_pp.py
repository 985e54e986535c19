"""Transformer++: convolution-attention heads and POS/NER multi-task base encoders.

Paper: Thapak and Hore, "Transformer++" (shared/papers/transformer_plus_plus.md), sections III-IV.
Everything not named here is the baseline Transformer of ``transformer.py`` (post-norm units,
FFN_2, sinusoidal positions, untied output layer), reused as is.

Equations, and the code that implements each:

* eq. 1, SelfAttn(QW^Q_i, KW^K_i, VW^V_i): the first H - H_c heads of :class:`ConvAttention`
  (``attend_heads``), scaled dot-product attention on d/H-wide slices.
* eq. 2, LocalConv(S, W_A, t, d) = Conv(S, softmax(W_A), t, d), W_A in R^{F x d}: the adaptive
  sequence module (``local_context``). A depthwise (one kernel per channel), dilated convolution
  whose F taps are softmax-normalised, so every output is a weighted average of the inputs in its
  window; DropConnect (Wan et al. 2013) drops entries of softmax(W_A) while training. The
  pointwise half of the paper's "depthwise separable" convolution is the heads' input projection
  and W^O.
* eq. 3, Query = sum_t (S W^S)_t softmax_t(S W^Q): the adaptive query module (``sentence_query``),
  an attention pooling of S W^S with one score S W^Q per position.
* eq. 4, DynamicConv(S, t, d) = Conv1D(LocalConv, Query): ``ConvAttention.forward`` (conv heads).
* eq. 5, MultiHead(S) = Concat(head_1 .. head_H) W^O: ``ConvAttention.out_proj`` over the
  concatenation [attention heads; convolution heads].
* Section III.A, base encoders: encoder unit 1 also feeds a linear + softmax POS tagger and unit 2
  an NER tagger (``TransformerPP.tag_heads``); the remaining (>= 1) units are plain. The tag
  cross-entropies are reported through :meth:`TransformerPP.extra_losses` and the trainer adds
  ``weight * loss`` to the translation loss.

Choices the paper leaves open, made here:

* Each convolution head works on its own d/H-wide linear projection of S (the paper's eq. 2
  convolves S itself, which would give heads of width d and break eq. 5's d x d W^O); W^S is
  likewise split into H_c slices of d x d/H and W^Q into H_c vectors, one per head. These
  projections and the attention heads' W^Q_i, W^K_i, W^V_i are row blocks of one linear layer
  (``ConvAttention.in_proj``), each block initialised as a layer of its own: the same model as
  separate layers, in one kernel.
* Every projection is affine (each block of ``in_proj`` has a bias), as the Transformer's W^Q_i,
  W^K_i, W^V_i are; eqs. 2-3 write W^S, W^Q and the convolution's input without one. The bias of
  the W^Q scores cancels in the softmax; the other two add learned per-channel offsets to
  LocalConv and Query.
* Eq. 4 "computes the dot product between LocalConv and Query". To keep a d/H-wide head output
  (LocalConv is "the key", DynamicConv "the value") we keep the products per channel:
  DynamicConv_t = LocalConv_t ⊙ Query, a depthwise 1x1 convolution of LocalConv with Query as
  its kernel; summing a head's channels gives exactly the paper's dot product.
* Encoder convolutions are centred (F//2 * dilation taps on each side); the paper's "causal"
  matters for the decoder only. Decoder convolutions are causal, and the decoder's Query at
  position t pools positions <= t only (a prefix softmax), so no future token leaks through it.
  ``step`` keeps the last (F-1)*dilation projected inputs and the running max / denominator /
  numerator of that softmax: a decoding step of the convolution heads costs the same whatever the
  prefix length, and equals the full decode (up to float rounding).
* Padding never leaks: the encoder zeroes padded positions before convolving and masks them out
  of the Query softmax, so a sentence encodes identically alone and inside a padded batch. A
  training batch without source padding (most are: they are cut from one source length) comes
  with ``src_pad_mask=None`` and skips the masking, as the Transformer's does.
* Convolution heads live in self-attention only; decoder cross-attention keeps H dot-product
  heads (a convolution over the target says nothing about the source).
* Every encoder and decoder unit has the mixed heads; unit i uses kernel_sizes[i] and
  dilations[i] (paper: F = 3, 5, 7, 11, 15; dilations unspecified, default 1).
* Section IV's regularisers map to: ``model.dropout`` = residual dropout (sublayer outputs),
  ``transformer_pp.embed_dropout`` = token-embedding dropout, ``transformer_pp.attention_dropout``
  = dropout on attention probabilities (self and cross), ``transformer_pp.weight_dropout`` =
  DropConnect on the convolution kernels. W_A starts near uniform (xavier-uniform logits).
* Tag losses are means over labelled source tokens (subwords carry their word's tag, see
  ``cometnmt/data/tagging.py``), and so are a step's over its accumulated micro-batches (the
  trainer weighs each by its share of the step's labelled tokens); the tag label sets are fixed
  by the config (UPOS for POS, BIO over ``ner_types`` for NER), so a checkpoint rebuilds its tag
  heads from its config alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cometnmt.errors import ConfigError
from cometnmt.models.base import State
from cometnmt.models.transformer import FeedForward, Transformer
from cometnmt.modules.attention import key_mask, sdpa
from cometnmt.modules.dropout import Dropout
from cometnmt.modules.embeddings import ScaledEmbedding

IGNORE = -100  # tag id of tokens without a label (padding, specials, unaligned pieces)
TAG_LAYER = {"pos": 0, "ner": 1}  # encoder unit (0-based) whose output feeds each tagger

# The label spaces of the tag heads. Fixed by the config, so a checkpoint rebuilds its heads from
# its config alone; cometnmt/data/tagging.py maps every annotator's output onto them.
UPOS = [
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
    "PUNCT", "SCONJ", "SYM", "VERB", "X",
]  # Universal Dependencies POS tags (spaCy's Token.pos_)
ONTONOTES_TYPES = [
    "CARDINAL", "DATE", "EVENT", "FAC", "GPE", "LANGUAGE", "LAW", "LOC", "MONEY", "NORP",
    "ORDINAL", "ORG", "PERCENT", "PERSON", "PRODUCT", "QUANTITY", "TIME", "WORK_OF_ART",
]  # the entity types of spaCy's English pipelines


def tag_labels(task: str, ner_types: list[str]) -> list[str]:
    """Labels of a task, index = tag id: UPOS for 'pos'; O, B-T, I-T for each type T for 'ner'."""
    if task == "pos":
        return list(UPOS)
    return ["O"] + [f"{bio}-{t}" for t in ner_types for bio in ("B", "I")]


@dataclass
class TransformerPPConfig:
    """Hyper-parameters of Transformer++ (``model.transformer_pp.*``)."""

    kernel_sizes: list[int] = field(default_factory=lambda: [3, 5, 7, 11, 15])  # F of unit i (enc and dec)
    dilations: list[int] = field(default_factory=lambda: [1, 1, 1, 1, 1])  # dilation of unit i
    conv_heads: Optional[int] = None  # convolution heads per unit; null: n_heads // 2 (the paper)
    weight_dropout: float = 0.1  # DropConnect on softmax(W_A)
    attention_dropout: float = 0.0  # dropout on attention probabilities
    embed_dropout: Optional[float] = None  # dropout on embeddings + positions; null: model.dropout
    tasks: list[Literal["pos", "ner"]] = field(default_factory=lambda: ["pos", "ner"])  # auxiliary tagging tasks, pos and/or ner; [] = translation only
    pos_weight: float = 1.0  # weight of the POS loss (encoder unit 1)
    ner_weight: float = 1.0  # weight of the NER loss (encoder unit 2)
    pos_tagger: str = "auto"  # auto | spacy:<installed pipeline> | hanta
    ner_tagger: str = "auto"  # auto | spacy:<installed pipeline>
    ner_types: list[str] = field(default_factory=lambda: list(ONTONOTES_TYPES))  # entity types (BIO labels)
    tag_cache_dir: Optional[str] = None  # annotations cache; null: $COMETNMT_CACHE/tags, else $XDG_CACHE_HOME (~/.cache)/cometnmt/tags


class ConvAttention(nn.Module):
    """MultiHead(S) = Concat(head_1..head_H) W^O (eq. 5): H - H_c dot-product heads (eq. 1) and
    H_c convolution heads (eqs. 2-4). Self-attention only: ``forward(x, x, pad_mask, causal)``
    and ``step(x, cache)`` fit the slots of ``MultiHeadAttention`` in the Transformer units."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        conv_heads: int,
        kernel_size: int,
        dilation: int,
        weight_dropout: float,
        attention_dropout: float,
    ) -> None:
        super().__init__()
        self.d_head = d_model // n_heads
        self.n_attn, self.n_conv = n_heads - conv_heads, conv_heads
        self.d_attn, self.d_conv = self.n_attn * self.d_head, conv_heads * self.d_head
        self.dilation = dilation
        self.context = (kernel_size - 1) * dilation  # positions the kernel spans besides t
        self.out_proj = nn.Linear(d_model, d_model)  # W^O (eq. 5)
        self.attn_dropout = nn.Dropout(attention_dropout)  # its p is handed to SDPA
        self.weight_dropout = Dropout(weight_dropout)  # DropConnect
        # Every projection of the input, as one linear layer (one kernel forward and one backward
        # instead of four; a GPU step here is bound by kernel launches). Its rows, in order:
        #   W^Q_i, W^K_i, W^V_i of the attention heads (3 Da), the adaptive sequence module's input
        #   (Dc), W^S (eq. 3; Dc) and W^Q (eq. 3; one vector per convolution head, Hc).
        self.split_sizes = [3 * self.d_attn, self.d_conv, self.d_conv, conv_heads]
        self.in_proj = nn.Linear(d_model, sum(self.split_sizes))
        if self.n_conv:
            self.kernel = nn.Parameter(torch.empty(self.d_conv, kernel_size))  # W_A (eq. 2), one row per channel
            nn.init.xavier_uniform_(self.kernel)
        with torch.no_grad():  # each block initialised as the separate layer it stands for
            for block in self.in_proj.weight.split(self.split_sizes):
                if block.numel():
                    nn.init.xavier_uniform_(block)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for lin in (self.in_proj, self.out_proj):
            nn.init.zeros_(lin.bias)

    _LEGACY = ("qkv", "seq_proj", "query_value", "query_score")  # the four layers in_proj replaced

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Checkpoints from before the fusion (separate qkv, seq_proj, query_value, query_score
        layers) load into ``in_proj``: their rows stacked in the same order."""
        for part in ("weight", "bias"):
            old = [prefix + f"{name}.{part}" for name in self._LEGACY]
            if prefix + f"in_proj.{part}" not in state_dict and any(k in state_dict for k in old):
                state_dict[prefix + f"in_proj.{part}"] = torch.cat([state_dict.pop(k) for k in old if k in state_dict])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv B,L,3Da; the sequence module's input u B,L,Dc; W^S x B,L,Dc; W^Q x B,L,Hc."""
        return self.in_proj(x).split(self.split_sizes, dim=-1)

    # -- dot-product heads (eq. 1) ---------------------------------------------------------------

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, n, self.d_head).transpose(1, 2)  # B,n,L,D/H

    def attend_heads(self, qkv: torch.Tensor, attn_mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """qkv B,L,3Da; attn_mask: the key_mask B,1,1,L of the pad mask (None: no padding)."""
        q, k, v = (self._heads(t, self.n_attn) for t in qkv.chunk(3, dim=-1))  # B,Ha,L,D/H each
        p = self.attn_dropout.p if self.training else 0.0
        out = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=causal)  # B,Ha,L,D/H
        return out.transpose(1, 2).flatten(2)  # B,L,Da

    # -- convolution heads (eqs. 2-4) ------------------------------------------------------------

    def kernel_weights(self) -> torch.Tensor:
        """softmax over the F taps of W_A, then DropConnect: Dc,1,K (K kernel)."""
        return self.weight_dropout(torch.softmax(self.kernel, dim=-1)).unsqueeze(1)  # Dc,1,K

    def local_context(self, u: torch.Tensor, pad_mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """LocalConv (eq. 2) of the projected input u B,L,Dc -> B,L,Dc. Padded inputs are zeroed first."""
        if pad_mask is not None:
            u = u.masked_fill(pad_mask.unsqueeze(-1), 0.0)
        h, pad = u.transpose(1, 2), self.context // 2  # B,Dc,L
        if causal or self.context % 2:  # zeros on the left only, or an uneven split: pad first
            h, pad = F.pad(h, (self.context, 0) if causal else (pad, self.context - pad)), 0  # B,Dc,L+context
        out = F.conv1d(h, self.kernel_weights(), padding=pad, dilation=self.dilation, groups=self.d_conv)  # B,Dc,L
        return out.transpose(1, 2)  # B,L,Dc

    def sentence_query(self, value: torch.Tensor, score: torch.Tensor, pad_mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """Query (eq. 3) per head from value = S W^S B,L,Dc and score = S W^Q B,L,Hc: B,1,Dc over the
        whole (unpadded) sentence, or B,L,Dc over each prefix when ``causal`` (a softmax over
        positions <= t). A masked softmax and one batched matrix product: SDPA would take its math
        path here on every device (its fused kernels need keys as wide as values, and these keys
        are one number) and dispatch about half as many operators again."""
        B, L, _ = value.shape
        s = score.transpose(1, 2).unsqueeze(2)  # B,Hc,1,L
        if causal:
            future = torch.ones(L, L, dtype=torch.bool, device=s.device).triu(1)  # L,L: key after query
            s = s.expand(B, self.n_conv, L, L).masked_fill(future, float("-inf"))  # B,Hc,L,L
        elif pad_mask is not None:
            s = s.masked_fill(pad_mask[:, None, None, :], float("-inf"))  # B,Hc,1,L
        weights = torch.softmax(s, dim=-1)  # B,Hc,L|1,L
        pooled = weights @ self._heads(value, self.n_conv)  # B,Hc,L|1,D/H
        return pooled.transpose(1, 2).flatten(2)  # B,L|1,Dc

    # -- the layer -------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, kv: torch.Tensor, pad_mask: Optional[torch.Tensor] = None, causal: bool = False,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Self-attention over x B,L,D (``kv`` must be ``x``); pad_mask B,L marks padding;
        ``attn_mask``: its key_mask B,1,1,L, if already built (as ``MultiHeadAttention``'s)."""
        if kv is not x:
            raise ValueError("ConvAttention is self-attention only: call it as attn(x, x, ...)")
        qkv, u, value, score = self._project(x)
        heads = []
        if self.n_attn:
            heads.append(self.attend_heads(qkv, key_mask(pad_mask) if attn_mask is None else attn_mask, causal))  # B,L,Da
        if self.n_conv:
            heads.append(self.local_context(u, pad_mask, causal) * self.sentence_query(value, score, pad_mask, causal))  # B,L,Dc
        return self.out_proj(torch.cat(heads, dim=-1))  # B,L,D

    def step(self, x: torch.Tensor, cache: dict) -> tuple[torch.Tensor, dict]:
        """Causal self-attention for one new position x B,1,D; returns B,1,D and a new cache.

        Cache: keys/values of the attention heads; the last (F-1)*dilation inputs of the
        convolution; running max, denominator and numerator of the Query's prefix softmax."""
        qkv, u, value, score = self._project(x)
        heads, new = [], {}
        if self.n_attn:
            q, k, v = (self._heads(t, self.n_attn) for t in qkv.chunk(3, dim=-1))  # B,Ha,1,D/H each
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)  # B,Ha,t,D/H
                v = torch.cat([cache["v"], v], dim=2)
            new["k"], new["v"] = k, v
            heads.append(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))  # B,1,Da
        if self.n_conv:
            local, new["window"] = self._local_step(u, cache.get("window"))  # B,1,Dc
            query, acc = self._query_step(value, score, cache)  # B,1,Dc
            new.update(acc)
            heads.append(local * query)
        return self.out_proj(torch.cat(heads, dim=-1)), new  # B,1,D

    def _local_step(self, u: torch.Tensor, history: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """u B,1,Dc: the projected input of the new position."""
        if history is None:
            history = u.new_zeros(u.shape[0], self.context, self.d_conv)  # B,context,Dc
        window = torch.cat([history, u], dim=1)  # B,context+1,Dc
        out = F.conv1d(window.transpose(1, 2), self.kernel_weights(), dilation=self.dilation, groups=self.d_conv)  # B,Dc,1
        return out.transpose(1, 2), window[:, 1:]  # B,1,Dc and B,context,Dc

    def _query_step(self, value: torch.Tensor, score: torch.Tensor, cache: dict) -> tuple[torch.Tensor, dict]:
        score = score[:, 0]  # B,Hc
        value = value[:, 0].reshape(-1, self.n_conv, self.d_head)  # B,Hc,D/H
        if "q_max" in cache:
            top = torch.maximum(cache["q_max"], score)  # B,Hc
            old, cur = torch.exp(cache["q_max"] - top), torch.exp(score - top)  # B,Hc each
            den = cache["q_den"] * old + cur  # B,Hc
            num = cache["q_num"] * old.unsqueeze(-1) + cur.unsqueeze(-1) * value  # B,Hc,D/H
        else:
            top, den, num = score, torch.ones_like(score), value
        query = (num / den.unsqueeze(-1)).flatten(1).unsqueeze(1)  # B,1,Dc
        return query, {"q_max": top, "q_den": den, "q_num": num}


class TransformerPP(Transformer):
    """The Transformer with :class:`ConvAttention` self-attention in every unit and optional POS/NER
    heads on encoder units 1 and 2. ``forward(src, src_pad_mask, tgt_in, features_only=False, tags=None)``: ``tags``
    maps a task to gold tag ids B,S (``IGNORE`` where unlabelled)."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        *,
        d_model: int,
        n_heads: int,
        enc_layers: int,
        dec_layers: int,
        d_ff: int,
        dropout: float,
        embed_dropout: float,
        max_positions: int,
        conv_heads: int,
        kernel_sizes: list[int],
        dilations: list[int],
        weight_dropout: float,
        attention_dropout: float,
        tag_classes: dict[str, int],
        tag_weights: dict[str, float],
    ) -> None:
        super().__init__(
            src_vocab_size, tgt_vocab_size, pad_id, d_model, n_heads, enc_layers, dec_layers, dropout, max_positions,
            encoder_ffn=lambda: FeedForward(d_model, d_ff), decoder_ffn=lambda: FeedForward(d_model, d_ff),
            attention_dropout=attention_dropout,  # cross-attention keeps it; self-attention is replaced below
        )
        self.src_embed = ScaledEmbedding(src_vocab_size, d_model, pad_id, max_positions, embed_dropout)
        self.tgt_embed = ScaledEmbedding(tgt_vocab_size, d_model, pad_id, max_positions, embed_dropout)

        def mixed(i: int) -> ConvAttention:
            return ConvAttention(d_model, n_heads, conv_heads, kernel_sizes[i], dilations[i], weight_dropout, attention_dropout)

        for i, unit in enumerate(self.encoder):
            unit.self_attn = mixed(i)
        for i, unit in enumerate(self.decoder):
            unit.self_attn = mixed(i)
        self.tag_heads = nn.ModuleDict({task: nn.Linear(d_model, n) for task, n in tag_classes.items()})
        self.tag_weights = dict(tag_weights)
        self._extra: dict[str, tuple[torch.Tensor, float]] = {}

    def encode_with_taps(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> tuple[State, dict[str, torch.Tensor]]:
        """Memory plus the outputs B,S,D of the units that feed a tagger."""
        x = self.src_embed(src)  # B,S,D
        taps = {}
        ctx = self.context(self.encoder, x, src_pad_mask, src_pad_mask)  # once a forward, not once a unit
        for i, unit in enumerate(self.encoder):
            x = unit(x, ctx)  # B,S,D
            taps.update({task: x for task in self.tag_heads if TAG_LAYER[task] == i})
        return {"out": x, "pad_mask": src_pad_mask}, taps

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> State:
        return self.encode_with_taps(src, src_pad_mask)[0]

    def forward(
        self, src: torch.Tensor, src_pad_mask: torch.Tensor, tgt_in: torch.Tensor, features_only: bool = False,
        tags: Optional[dict[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        memory, taps = self.encode_with_taps(src, src_pad_mask)
        self._extra = self.tag_losses(taps, tags)
        return self.decode_features(tgt_in, memory) if features_only else self.decode(tgt_in, memory)  # B,T,D / B,T,V

    def tag_losses(self, taps: dict[str, torch.Tensor], tags: Optional[dict[str, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, float]]:
        """Mean cross-entropy over labelled source tokens, per task. Training without the gold tags
        of an enabled task is an error, never a silent skip; evaluation without tags has no tag loss."""
        if not self.tag_heads or (tags is None and not self.training):
            return {}
        missing = [task for task in self.tag_heads if tags is None or task not in tags]
        if missing:
            raise ConfigError(
                f"model.transformer_pp.tasks includes {missing} but the training batch carries no such tags: "
                "annotate the data with cometnmt.data.tagging.attach_training_tags and pass tags=batch.tags, "
                "or set model.transformer_pp.tasks to []"
            )
        out = {}
        for task, head in self.tag_heads.items():
            gold = tags[task]  # B,S
            logits = head(taps[task]).float()  # B,S,C
            total = F.cross_entropy(logits.flatten(0, 1), gold.flatten(), ignore_index=IGNORE, reduction="sum")
            count = gold.ne(IGNORE).sum().clamp(min=1)
            out[task] = (total / count, self.tag_weights[task])
        return out

    def extra_losses(self) -> dict[str, tuple[torch.Tensor, float]]:
        return dict(self._extra)

    def train(self, mode: bool = True) -> "TransformerPP":
        """Also drop the tag losses of the last forward (``eval()`` calls this too): the last training
        step's stayed on the module, with their autograd nodes, for as long as the model lived (a
        Translator made of the trained model, serve's shared one). Inference never stores any: search,
        forced decoding and attention call ``encode``/``decode``/``step``, not ``forward``."""
        self._extra = {}
        return super().train(mode)


def check_config(cfg) -> None:
    """Cross-field checks of model.transformer_pp against the shared sizes; ConfigError naming keys."""
    c = cfg.transformer_pp
    layers = max(cfg.enc_layers, cfg.dec_layers)
    for key in ("kernel_sizes", "dilations"):
        values = getattr(c, key)
        if len(values) < layers:
            raise ConfigError.at(
                f"model.transformer_pp.{key}", f"{values} has {len(values)} entries but the model has "
                f"{layers} units (model.enc_layers={cfg.enc_layers}, model.dec_layers={cfg.dec_layers}); give one per unit",
                also=("model.enc_layers", "model.dec_layers")
            )
        if any(v < 1 for v in values):
            raise ConfigError.at(f"model.transformer_pp.{key}", f"every entry must be at least 1, got {values}")
    conv = cfg.n_heads // 2 if c.conv_heads is None else c.conv_heads
    if not 0 <= conv <= cfg.n_heads:
        raise ConfigError.at("model.transformer_pp.conv_heads", f"{conv} must be between 0 and model.n_heads={cfg.n_heads}",
                             also=("model.n_heads",))
    for key in ("weight_dropout", "attention_dropout", "embed_dropout"):
        p = getattr(c, key)
        if p is not None and not 0.0 <= p < 1.0:
            raise ConfigError.at(f"model.transformer_pp.{key}", f"{p} must be in [0, 1)")
    for key in ("pos_weight", "ner_weight"):
        w = getattr(c, key)
        if not (math.isfinite(w) and w >= 0):  # a negative weight would train the encoder to unlearn the tags
            raise ConfigError.at(f"model.transformer_pp.{key}", f"must be a finite number at least 0, got {w}")
    if len(set(c.tasks)) != len(c.tasks):
        raise ConfigError.at("model.transformer_pp.tasks", f"{c.tasks} lists a task twice")
    needed = max((TAG_LAYER[task] for task in c.tasks if task in TAG_LAYER), default=-2) + 2
    if cfg.enc_layers < needed:  # 3 with NER (unit 2), 2 with POS alone (unit 1)
        raise ConfigError.at(
            "model.enc_layers", f"{cfg.enc_layers} is too few for model.transformer_pp.tasks={c.tasks}; the "
            f"POS and NER base encoders (units 1 and 2) need at least one plain unit after the last of them "
            f"(>= {needed}), or set tasks: []", also=("model.transformer_pp.tasks",)
        )
    if "ner" in c.tasks and not c.ner_types:
        raise ConfigError.at("model.transformer_pp.ner_types", "empty, but 'ner' is in model.transformer_pp.tasks",
                             also=("model.transformer_pp.tasks",))
    if len(set(c.ner_types)) != len(c.ner_types):  # a second B-/I- pair of a type that no tag ever names
        twice = sorted({t for t in c.ner_types if c.ner_types.count(t) > 1})
        raise ConfigError.at("model.transformer_pp.ner_types", f"lists {twice} more than once")
    if c.tag_cache_dir is not None and not c.tag_cache_dir.strip():  # `--set ...tag_cache_dir=$UNSET` was the default
        raise ConfigError.at("model.transformer_pp.tag_cache_dir", "empty; give a folder, or null for the default")


def tag_classes(c: TransformerPPConfig) -> dict[str, int]:
    """Number of labels of each enabled task: UPOS for POS, O + B-/I- per type for NER."""
    return {task: len(tag_labels(task, c.ner_types)) for task in c.tasks}


def build_transformer_pp(cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> TransformerPP:
    """Transformer++ from a ModelConfig (shared sizes + ``cfg.transformer_pp``)."""
    check_config(cfg)
    c = cfg.transformer_pp
    return TransformerPP(
        src_vocab_size,
        tgt_vocab_size,
        pad_id,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        enc_layers=cfg.enc_layers,
        dec_layers=cfg.dec_layers,
        d_ff=cfg.d_ff,
        dropout=cfg.dropout,
        embed_dropout=cfg.dropout if c.embed_dropout is None else c.embed_dropout,
        max_positions=cfg.max_positions,
        conv_heads=cfg.n_heads // 2 if c.conv_heads is None else c.conv_heads,
        kernel_sizes=c.kernel_sizes,
        dilations=c.dilations,
        weight_dropout=c.weight_dropout,
        attention_dropout=c.attention_dropout,
        tag_classes=tag_classes(c),
        tag_weights={"pos": c.pos_weight, "ner": c.ner_weight},
    )
