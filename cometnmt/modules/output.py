"""The output layer onto the target vocabulary, computed in column blocks on the CPU.

The logits product (tokens x d_model) @ (d_model x V) has a short inner dimension and a wide output
(V = 6,191 on Multi30k). On the development CPU (AVX2), MKL ran it at 60-100 GFLOP/s as one call,
against 130-170 for the same product split into 512-column blocks written into one output tensor
(2,041 training tokens: 1.8x; 640 beam rows: 1.4x; bench/README.md); on an AVX-512 CPU the one
call is the faster, so the blocks are used only where ``BLOCKED_ON`` names the CPU's capability. ``VocabProjection`` is an
``nn.Linear`` (same parameters and state-dict keys) whose CPU float32 forward does that; the
backward is the ordinary pair of products, which MKL already runs well. Elsewhere (CUDA, bf16
autocast, small inputs) it is ``F.linear``. A test checks values and gradients against F.linear.

The blocked product is a custom operator (``cometnmt::blocked_linear``, with a shape function and
its backward registered), so ``torch.compile`` keeps it as one opaque call in the graph: its ``out=``
writes would break the graph if traced, and inductor's own single product is the slow one above.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 512  # output columns per product
# the CPUs where the blocks were measured to help: on an AVX2 EPYC 1.4-1.8x; on an AVX-512 Xeon
# (2026-11-29) MKL's one product was the faster at every size (128 rows: 1.42 against 1.77 ms, 640:
# 6.1 against 7.2, 2,048: 31.8 against 35.3; bench/README.md), the blocks' strided bias copies
# included. Other CPUs, unmeasured, take the one product.
BLOCKED_ON = ("AVX2",)
CPU_CAPABILITY = torch.backends.cpu.get_cpu_capability()  # read once: torch.compile cannot trace the call


def _blocked_addmm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x N,D @ weight.T (weight V,D) + bias, written block by block into one N,V tensor."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    for s in range(0, weight.shape[0], BLOCK):
        cols = slice(s, s + BLOCK)
        if bias is None:
            torch.mm(x, weight[cols].t(), out=out[:, cols])
        else:
            torch.addmm(bias[cols], x, weight[cols].t(), out=out[:, cols])
    return out


@torch.library.custom_op("cometnmt::blocked_linear", mutates_args=(), device_types="cpu")
def blocked_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x N,D -> N,V as ``F.linear``, by ``_blocked_addmm``; differentiable, and one node under torch.compile."""
    return _blocked_addmm(x, weight, bias)


@blocked_linear.register_fake
def _blocked_linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _blocked_linear_setup(ctx, inputs, output) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _blocked_linear_backward(ctx, grad: torch.Tensor):
    x, weight = ctx.saved_tensors
    grad_x = grad @ weight if ctx.needs_input_grad[0] else None  # N,D
    grad_w = grad.t() @ x if ctx.needs_input_grad[1] else None  # V,D
    grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None  # V
    return grad_x, grad_w, grad_b


blocked_linear.register_autograd(_blocked_linear_backward, setup_context=_blocked_linear_setup)


class VocabProjection(nn.Linear):
    """``nn.Linear(d_model, vocab_size)`` with the blocked CPU forward described above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._blocked(x):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])  # N,D
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            out = blocked_linear(flat, self.weight, self.bias)
        else:  # decoding: the plain function, without the operator's dispatch
            out = _blocked_addmm(flat, self.weight, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def _blocked(self, x: torch.Tensor) -> bool:
        return (
            x.device.type == "cpu"
            and CPU_CAPABILITY in BLOCKED_ON
            and x.dtype == self.weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
            and self.out_features > 2 * BLOCK
            and x.numel() >= 64 * x.shape[-1]  # at least 64 rows: below that, blocking buys nothing
        )
