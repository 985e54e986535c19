"""Token-level cross-entropy with one pass over the logits in the backward.

``F.cross_entropy`` runs as log_softmax + nll_loss, and its backward zero-fills an N x V gradient,
scatters -1 into it and then runs log_softmax's backward over it: three passes over the largest
tensor of a training step (2,048 tokens x a 6,191-word vocabulary = 50 MB on Multi30k). The
gradient has a closed form, softmax(z) - q with q the (smoothed) target distribution, so here the
backward is one exp over the saved log-probabilities, one shift and scale, and a scatter of
-(1 - eps) at the gold ids: the same values as ``F.cross_entropy(..., reduction="sum")`` (a test
checks both, with and without label smoothing and ignored positions) in about half the time.

Label smoothing follows PyTorch's definition: loss = (1 - eps) * nll + eps * mean over the
vocabulary of -log p, summed over the positions whose gold id is not ``ignore_index``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class _SummedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, gold: torch.Tensor, ignore_index: int, eps: float) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=-1)  # N,V
        keep = gold.ne(ignore_index)  # N
        safe = gold.masked_fill(~keep, 0).unsqueeze(1)  # N,1: any valid index where ignored
        loss = -logp.gather(1, safe).squeeze(1)  # N
        if eps > 0.0:
            loss = (1.0 - eps) * loss - eps * logp.mean(dim=-1)
        ctx.save_for_backward(logp, safe, keep)
        ctx.eps = eps
        return loss.masked_fill(~keep, 0.0).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logp, safe, keep = ctx.saved_tensors
        eps = ctx.eps
        weight = (keep.to(logp.dtype) * grad_out).unsqueeze(1)  # N,1: 0 at ignored positions
        grad = torch.exp(logp)  # softmax
        if eps > 0.0:
            grad.sub_(eps / logp.size(1))
        grad.mul_(weight)
        grad.scatter_add_(1, safe, weight * -(1.0 - eps))
        return grad, None, None, None


def summed_cross_entropy(logits: torch.Tensor, gold: torch.Tensor, ignore_index: int, label_smoothing: float = 0.0) -> torch.Tensor:
    """Sum over positions of the (label-smoothed) cross-entropy; logits N,V (float), gold N."""
    if logits.dim() != 2 or gold.shape != logits.shape[:1]:
        raise ValueError(f"logits must be N,V and gold N; got {tuple(logits.shape)} and {tuple(gold.shape)}")
    return _SummedCrossEntropy.apply(logits, gold, ignore_index, float(label_smoothing))


def _chunk_rows(vocab: int) -> int:
    """Rows of one block of the fused loss: about 8 MB of float32 logits, 32 to 1,024 rows."""
    return max(32, min(1024, (1 << 21) // max(vocab, 1)))


class _LinearCrossEntropy(torch.autograd.Function):
    """The output layer and the summed cross-entropy in one pass over row blocks (forward), the
    gradients of its inputs computed there and scaled by the loss's gradient in the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, gold, ignore_index: int, eps: float, needs: tuple[bool, bool, bool],
                low: torch.dtype | None):
        N, V = hidden.size(0), weight.size(0)
        keep = gold.ne(ignore_index)  # N
        safe = gold.masked_fill(~keep, 0).unsqueeze(1)  # N,1: any valid index where ignored
        acc = hidden.dtype if low is None else torch.float32  # the softmax's and loss's type
        kept = keep.to(acc).unsqueeze(1)  # N,1
        grad_h = torch.empty_like(hidden) if needs[0] else None
        grad_w = torch.zeros_like(weight) if needs[1] else None
        grad_b = torch.zeros_like(bias) if needs[2] else None
        rows = _chunk_rows(V)
        block = hidden.new_empty(min(rows, N), V, dtype=acc)  # reused by every block: no N x V tensor
        losses = hidden.new_empty(N, dtype=acc)
        if low is not None:  # the products in ``low`` (bf16), as autocast runs F.linear; the rest in float32
            hidden, weight = hidden.to(low), weight.to(low)
            bias = None if bias is None else bias.to(low)
            products = block.new_empty(block.shape, dtype=low)
        for s in range(0, N, rows):
            e = min(N, s + rows)
            h, z, g, w = hidden[s:e], block[: e - s], safe[s:e], kept[s:e]
            p = z if low is None else products[: e - s]  # the logits as the product gives them
            if bias is None:
                torch.mm(h, weight.t(), out=p)
            else:
                torch.addmm(bias, h, weight.t(), out=p)
            if low is not None:
                z.copy_(p)
            z.sub_(z.amax(dim=1, keepdim=True))  # shifted logits: log-softmax = z - log(sum(exp(z)))
            loss = -z.gather(1, g).squeeze(1)  # -(gold's shifted logit)
            if eps > 0.0:
                loss = (1.0 - eps) * loss - eps * z.mean(dim=1)
            total = z.exp_().sum(dim=1, keepdim=True)  # exp(z), and its row sums
            losses[s:e] = loss + total.squeeze(1).log()
            if grad_h is None and grad_w is None and grad_b is None:
                continue
            z.mul_(w / total)  # softmax, 0 at ignored rows
            if eps > 0.0:
                z.sub_(w * (eps / V))
            z.scatter_add_(1, g, w * -(1.0 - eps))  # d loss / d logits
            if grad_b is not None:
                grad_b.add_(z.sum(dim=0).to(grad_b.dtype))
            if low is not None:  # the gradient's products in ``low`` too, summed over blocks in float32
                dz = p.copy_(z)
                if grad_h is not None:
                    grad_h[s:e] = torch.mm(dz, weight)
                if grad_w is not None:
                    grad_w.add_(torch.mm(dz.t(), h))
                continue
            if grad_h is not None:
                torch.mm(z, weight, out=grad_h[s:e])
            if grad_w is not None:
                grad_w.addmm_(z.t(), h)
        ctx.save_for_backward(*(t for t in (grad_h, grad_w, grad_b) if t is not None))
        ctx.needs = needs
        return losses.masked_fill_(~keep, 0.0).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad_out if need else None for need in ctx.needs]
        return (*grads, None, None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gold: torch.Tensor,
                         ignore_index: int, label_smoothing: float = 0.0, low: torch.dtype | None = None) -> torch.Tensor:
    """``summed_cross_entropy(F.linear(hidden, weight, bias), gold, ...)`` without the N x V logits.

    hidden N,D; weight V,D; bias V or None; gold N. The logits are formed a block of rows at a time
    (about 8 MB) into one reused buffer, and each block's softmax, loss and gradient are done
    before the next: the gradients of hidden, weight and bias are computed in the forward and
    scaled by the loss's gradient in the backward. A training step then writes no tensor of the
    logits' size (three of them before: logits, log-probabilities, their gradient, 50 MB each at
    2,048 tokens x 6,191 words). On the AVX-512 Xeon (bench/README.md) the output layer and loss,
    forward and backward, took 71-76 ms against 85-90 (with ``keep_freed_memory``; 121 without),
    and a paper-size training step 3% less. The same values as the unfused pair (a test checks
    both, with and without label smoothing, ignored positions and bias). Computes gradients only
    for inputs that require them under grad mode; in ``torch.no_grad`` it is the loss alone.

    ``low`` (``torch.bfloat16`` under ``train.precision: bf16``): the output layer's products (logits,
    and the gradients of hidden and weight) in that type, as autocast runs ``F.linear`` and its
    backward, the softmax and loss in float32 as ``logits.float()`` would; the weight's gradient is
    summed over the blocks in float32. Autocast is off inside (the casts are these). On the AMX Xeon
    it saves memory, not time: the paper-size Transformer's bf16 training step took 0.275-0.311 s
    fused against 0.277-0.297 s with the logits and ``token_loss`` (the trainer's steps, alternating),
    and ``bench.py --precision bf16``'s peak memory fell from 995 to 811 MiB (COMET: 832 to 673).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.size(1) != weight.size(1) or gold.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be N,D, weight V,D and gold N; got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)} and {tuple(gold.shape)}")
    grad = torch.is_grad_enabled()
    needs = (grad and hidden.requires_grad, grad and weight.requires_grad, grad and bias is not None and bias.requires_grad)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, bias, gold, ignore_index, float(label_smoothing), needs, low)
