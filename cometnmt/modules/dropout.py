"""Dropout whose CPU mask costs a quarter of a random draw per element.

``nn.Dropout`` on the CPU draws one Bernoulli sample per element (``bernoulli_``), which on the
paper-size models took about 6% of a training step (bench/README.md). Here, on the CPU, one
64-bit draw gives the masks of four elements: each 16-bit word u of it is uniform on 0..65535, an
element is kept where u >= round(p * 65536), and kept elements are scaled by 1 / (1 - p'), with
p' = round(p * 65536) / 65536 the probability actually used (it differs from p by less than 8e-6;
p = 0.1 gives p' = 0.100006, p = 0.3 gives 0.299998). The mask is still drawn from PyTorch's
global generator, so ``torch.manual_seed`` and checkpointed RNG states reproduce it exactly.

On other devices (CUDA's dropout kernel is already fused and fast), under ``torch.compile``
(whose graphs cannot hold the in-place ``random_``; the compiler fuses its own dropout) and for
p = 0 this is ``nn.Dropout``. It subclasses ``nn.Dropout``, so code that finds dropout modules by
type, or sets ``.p``, works unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16  # values of one 16-bit word


def cpu_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of x (any shape, on the CPU) with drop probability round(p*2^16)/2^16."""
    drop = round(p * _LEVELS)  # words below this are dropped
    if drop == 0:
        return x
    if drop >= _LEVELS:
        return torch.zeros_like(x)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)  # 64 random bits each
    u = words.view(torch.int16)[:n].view(x.shape)  # signed 16-bit words: u + 32768 is uniform on 0..65535
    keep = u >= drop - (_LEVELS // 2)
    return torch.where(keep, x * (_LEVELS / (_LEVELS - drop)), 0.0)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the cheaper CPU mask above (inplace is not supported)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or torch.compiler.is_compiling():  # compiled: the compiler's fused dropout
            return F.dropout(x, self.p, True)
        return cpu_dropout(x, self.p)
