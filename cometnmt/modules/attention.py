"""Multi-head attention on PyTorch's fused ``scaled_dot_product_attention``, with an incremental
key/value cache for decoding. This is the one place where our ``pad_mask`` (True = padding) is
turned into what PyTorch wants (an additive/boolean mask where True = may attend)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def key_mask(pad_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """pad_mask B,S (True = padding) -> SDPA boolean mask B,1,1,S (True = may attend)."""
    if pad_mask is None:
        return None
    return (~pad_mask)[:, None, None, :]  # B,1,1,S


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
         dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, but in float32 where PyTorch's CPU kernel is slow: its
    flash-attention backward on 16-bit inputs without dropout. Measured with torch 2.13 on the AMX
    Xeon (128 x 8 heads x 16 x 32, forward + backward): bfloat16 40.7-41.4 ms and float16 40.2-41.9 ms
    against 3.7-4.3 ms cast to float32 and back; with attention dropout 0.1 bfloat16 is the faster
    (6.3 against 9.8 ms) and is kept, as are inference and the GPU. Under ``train.precision: bf16``
    on the CPU this took the paper-size Transformer's step from 0.60 to 0.31 s (its attention has no
    dropout). The output is in the inputs' dtype, as autocast's SDPA gives it."""
    if (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and dropout_p == 0.0
            and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                                  is_causal=is_causal).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


class KeepsWeights:
    """An attention module that can keep its attention weights (``Seq2Seq.cross_attention``): while
    ``keep_weights`` is set, each forward calls :meth:`keep` with its weights B,H,Lq,Lk (float32
    in ``kept``; H = 1 where there are no heads). Off (the class default) the forward is unchanged."""

    keep_weights = False
    kept: list

    def keep(self, weights: torch.Tensor) -> None:
        self.kept.append(weights.detach().float())


class MultiHeadAttention(KeepsWeights, nn.Module):
    """h heads of scaled dot-product attention; W_q, W_k, W_v and W_o are affine (section 3.2)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)  # a module like every dropout; its p is handed to SDPA
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # B,H,L,D/H

    @staticmethod
    def project(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
        """Several projections of the same input. In training, one matrix product: a D x nD product
        and its two backward products run a little faster than n thin D x D ones (5% on the
        development CPU) and a GPU launches fewer kernels. Without gradients (search), concatenating
        the weights at every step would cost more than it saves, so the products stay separate.
        The parameters are separate Linear layers either way."""
        if not torch.is_grad_enabled():
            return tuple(lin(x) for lin in linears)  # B,L,D each
        w = torch.cat([lin.weight for lin in linears])  # nD,D
        b = torch.cat([lin.bias for lin in linears])  # nD
        return F.linear(x, w, b).chunk(len(linears), dim=-1)  # B,L,D each

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a fixed memory (cross-attention), computed once per sentence."""
        k, v = self.project(memory, (self.k_proj, self.v_proj))  # B,S,D each
        return self.split(k), self.split(v)  # B,H,S,D/H each

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """q B,Lq,D (unprojected); k, v B,H,Lk,D/H (projected) -> B,Lq,D."""
        return self.attend_heads(self.split(self.q_proj(q)), k, v, mask, causal)

    def attend_grouped(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], group: int) -> torch.Tensor:
        """q (n*group),1,D (unprojected): ``group`` consecutive rows per entry of k, v n,H,S,D/H
        (projected) and mask n,1,1,S -> (n*group),1,D. The rows of one entry (beam search's K
        hypotheses of a sentence) attend as one block of ``group`` queries, so each sentence's
        keys and values are read once per step, not copied and read K times."""
        if group == 1:
            return self.attend(q, k, v, mask, causal=False)
        n = k.size(0)
        qh = self.split(self.q_proj(q).view(n, group, -1))  # n,H,group,D/H
        return self.attend_heads(qh, k, v, mask, causal=False).reshape(n * group, 1, -1)  # (n*group),1,D

    def attend_heads(self, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """qh, k, v B,H,L,D/H (projected) -> B,Lq,D."""
        B, _, Lq, _ = qh.shape
        if self.keep_weights:  # the weights themselves, which the fused kernel never forms (eval only)
            out = self._attend_keeping(qh, k, v, mask, causal)
        else:
            out = sdpa(qh, k, v, attn_mask=mask, dropout_p=self.attn_dropout.p if self.training else 0.0,
                       is_causal=causal)  # B,H,Lq,D/H
        return self.out_proj(out.transpose(1, 2).reshape(B, Lq, -1))  # B,Lq,D

    def _attend_keeping(self, qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                        causal: bool) -> torch.Tensor:
        """What SDPA computes (without dropout), written out so the weights can be kept: B,H,Lq,D/H.
        Only attention over the source keeps its weights (``Seq2Seq.cross_attention``), never causal."""
        if causal:
            raise ValueError("attention weights are kept for attention over the source only, not causal self-attention")
        scores = torch.matmul(qh.float(), k.float().transpose(-1, -2)) * qh.size(-1) ** -0.5  # B,H,Lq,Lk
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        self.keep(weights)  # B,H,Lq,Lk
        return torch.matmul(weights, v.float()).to(v.dtype)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, pad_mask: Optional[torch.Tensor] = None, causal: bool = False,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Full attention: q B,Lq,D over kv B,Lk,D; pad_mask B,Lk marks padded keys. ``attn_mask``:
        its :func:`key_mask` B,1,1,Lk, where the caller built it once for all its layers."""
        mask = key_mask(pad_mask) if attn_mask is None else attn_mask  # B,1,1,Lk
        if q is kv:  # self-attention: queries, keys and values in one product
            qh, k, v = (self.split(t) for t in self.project(q, (self.q_proj, self.k_proj, self.v_proj)))  # B,H,L,D/H each
            return self.attend_heads(qh, k, v, mask, causal)
        k, v = self.project_kv(kv)
        return self.attend(q, k, v, mask, causal)

    def step(self, x: torch.Tensor, cache: dict) -> tuple[torch.Tensor, dict]:
        """Self-attention for one new position x B,1,D over the cached keys/values plus its own.

        Returns the output B,1,D and a new cache; the given cache is not modified.
        """
        qh, k, v = (self.split(t) for t in self.project(x, (self.q_proj, self.k_proj, self.v_proj)))  # B,H,1,D/H each
        if "k" in cache:
            k = torch.cat([cache["k"], k], dim=2)  # B,H,t,D/H
            v = torch.cat([cache["v"], v], dim=2)
        return self.attend_heads(qh, k, v, None, causal=False), {"k": k, "v": v}
