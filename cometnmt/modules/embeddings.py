"""Token embeddings scaled by sqrt(d_model) plus sinusoidal positions (Vaswani et al. 2017, eq. 5
of the COMET paper), with dropout on the sum."""

from __future__ import annotations

import math

import torch
from torch import nn

from cometnmt.modules.dropout import Dropout


def sinusoidal_table(max_positions: int, d_model: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...) -> max_positions, D."""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)  # P,1
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # D/2
    table = torch.zeros(max_positions, d_model)  # P,D
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table


class ScaledEmbedding(nn.Module):
    """embedding(x) * sqrt(d) + PE[offset : offset + len], then dropout."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()
        self.scale = math.sqrt(d_model)
        self.register_buffer("positions", sinusoidal_table(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = tokens.size(1)
        if offset + length > self.positions.size(0):
            raise ValueError(f"sequence of length {offset + length} exceeds model.max_positions={self.positions.size(0)}")
        x = self.embed(tokens) * self.scale  # B,L,D
        return self.dropout(x + self.positions[offset : offset + length])  # B,L,D
