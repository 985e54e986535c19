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


class MultiHeadAttention(nn.Module):
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
        self.dropout = dropout
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # B,H,L,D/H

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a fixed memory (cross-attention), computed once per sentence."""
        return self.split(self.k_proj(memory)), self.split(self.v_proj(memory))  # B,H,S,D/H each

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
        """q B,Lq,D (unprojected); k, v B,H,Lk,D/H (projected) -> B,Lq,D."""
        B, Lq, D = q.shape
        qh = self.split(self.q_proj(q))  # B,H,Lq,D/H
        out = F.scaled_dot_product_attention(
            qh, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )  # B,H,Lq,D/H
        return self.out_proj(out.transpose(1, 2).reshape(B, Lq, D))  # B,Lq,D

    def forward(self, q: torch.Tensor, kv: torch.Tensor, pad_mask: Optional[torch.Tensor] = None, causal: bool = False) -> torch.Tensor:
        """Full attention: q B,Lq,D over kv B,Lk,D; pad_mask B,Lk marks padded keys."""
        k, v = self.project_kv(kv)
        return self.attend(q, k, v, key_mask(pad_mask), causal)

    def step(self, x: torch.Tensor, cache: dict) -> tuple[torch.Tensor, dict]:
        """Self-attention for one new position x B,1,D over the cached keys/values plus its own.

        Returns the output B,1,D and a new cache; the given cache is not modified.
        """
        k, v = self.project_kv(x)  # B,H,1,D/H
        if "k" in cache:
            k = torch.cat([cache["k"], k], dim=2)  # B,H,t,D/H
            v = torch.cat([cache["v"], v], dim=2)
        return self.attend(x, k, v, None, causal=False), {"k": k, "v": v}
