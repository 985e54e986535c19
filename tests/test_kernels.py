"""The CPU speed pieces compute what they replace: the one-pass cross-entropy and the fused output
layer + cross-entropy equal F.cross_entropy (values and gradients), the trainer uses the fused one
on the CPU and trains the same weights, the CPU dropout drops with probability p and rescales, the
blocked output layer equals F.linear (values and gradients), and keeping freed memory changes no
result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cometnmt.modules.dropout import Dropout, cpu_dropout
from cometnmt.modules.output import VocabProjection
from cometnmt.training.host_memory import keep_freed_memory
from cometnmt.training.loss import _chunk_rows, linear_cross_entropy, summed_cross_entropy


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_summed_cross_entropy_equals_torch(eps):
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(40, 17, generator=gen)).requires_grad_()
    gold = torch.randint(0, 17, (40,), generator=gen)
    gold[::5] = 0  # ignored positions (PAD)
    ours = summed_cross_entropy(logits, gold, 0, eps)
    (g_ours,) = torch.autograd.grad(2.5 * ours, logits)
    ref = F.cross_entropy(logits, gold, ignore_index=0, label_smoothing=eps, reduction="sum")
    (g_ref,) = torch.autograd.grad(2.5 * ref, logits)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(g_ours, g_ref)
    assert g_ours[::5].abs().max() == 0  # no gradient from ignored positions


def test_summed_cross_entropy_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="N,V"):
        summed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), 0)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_cross_entropy_equals_linear_then_cross_entropy(eps, bias):
    gen = torch.Generator().manual_seed(1)
    V = 1500  # 1,398 rows a block: 3,000 rows are three blocks, the last a short one
    assert 3000 % _chunk_rows(V) != 0 and 3000 > 2 * _chunk_rows(V)
    hidden = torch.randn(3000, 24, generator=gen).requires_grad_()
    weight = (0.5 * torch.randn(V, 24, generator=gen)).requires_grad_()
    b = torch.randn(V, generator=gen).requires_grad_() if bias else None
    gold = torch.randint(0, V, (3000,), generator=gen)
    gold[::7] = 1  # ignored positions
    inputs = [hidden, weight] + ([b] if bias else [])
    ours = linear_cross_entropy(hidden, weight, b, gold, 1, eps)
    g_ours = torch.autograd.grad(2.5 * ours, inputs)
    ref = F.cross_entropy(F.linear(hidden, weight, b), gold, ignore_index=1, label_smoothing=eps, reduction="sum")
    g_ref = torch.autograd.grad(2.5 * ref, inputs)
    torch.testing.assert_close(ours, ref)
    for a, r in zip(g_ours, g_ref):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)
    assert g_ours[0][::7].abs().max() == 0  # no gradient from ignored positions
    with torch.no_grad():  # the loss alone
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, b, gold, 1, eps), ref.detach())


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_linear_cross_entropy_in_bf16_is_autocasts_linear_then_float32_cross_entropy(eps):
    """``low=torch.bfloat16`` (train.precision bf16 on the CPU): what autocast's F.linear and a float32
    cross-entropy of its logits give, over several blocks, to bf16's rounding (the weight's gradient
    is summed over blocks in float32, where autocast's one product rounds it once to bf16), and
    further from the float32 loss than that: the products are bf16's."""
    gen = torch.Generator().manual_seed(2)
    V = 1500
    hidden = torch.randn(3000, 24, generator=gen).requires_grad_()
    weight = (0.5 * torch.randn(V, 24, generator=gen)).requires_grad_()
    b = torch.randn(V, generator=gen).requires_grad_()
    gold = torch.randint(0, V, (3000,), generator=gen)
    gold[::7] = 1
    inputs = [hidden, weight, b]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = linear_cross_entropy(hidden, weight, b, gold, 1, eps, low=torch.bfloat16)
        logits = F.linear(hidden, weight, b)
    assert ours.dtype == torch.float32 and logits.dtype == torch.bfloat16
    ref = F.cross_entropy(logits.float(), gold, ignore_index=1, label_smoothing=eps, reduction="sum")
    g_ours, g_ref = torch.autograd.grad(ours, inputs), torch.autograd.grad(ref, inputs)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)
    for a, r in zip(g_ours, g_ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, r, rtol=2e-2, atol=2e-2 * float(r.abs().max()))
    exact = F.cross_entropy(F.linear(hidden, weight, b), gold, ignore_index=1, label_smoothing=eps, reduction="sum")
    assert abs(float(ours - exact)) > 1e-6 * float(exact)  # the bf16 products, not float32's


def test_linear_cross_entropy_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="N,D"):
        linear_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(5, 4), None, torch.zeros(2, 3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="N,D"):
        linear_cross_entropy(torch.zeros(6, 4), torch.zeros(5, 3), None, torch.zeros(6, dtype=torch.long), 0)


def test_cpu_dropout_drops_with_probability_p_and_keeps_the_mean():
    torch.manual_seed(0)
    x = torch.ones(400_000)
    for p in (0.1, 0.3):
        y = cpu_dropout(x, p)
        dropped = (y == 0).float().mean().item()
        assert abs(dropped - p) < 0.003  # 4.6 sigma at n = 400k
        values = torch.unique(y).tolist()
        assert values[0] == 0.0 and values[1:] == [pytest.approx(1 / (1 - round(p * 65536) / 65536))]
        assert abs(y.mean().item() - 1.0) < 0.005


def test_cpu_dropout_masks_are_independent_across_neighbours():
    """Four masks come from one 64-bit draw: neighbouring elements must still be independent."""
    torch.manual_seed(1)
    keep = cpu_dropout(torch.ones(400_000), 0.5).ne(0).float().view(-1, 4)
    for i in range(3):
        both = (keep[:, i] * keep[:, i + 1]).mean().item()
        assert abs(both - 0.25) < 0.005


def test_dropout_module_is_seeded_and_is_the_identity_in_eval():
    drop = Dropout(0.1)
    x = torch.randn(3, 5, 7)
    torch.manual_seed(4)
    a = drop(x)
    torch.manual_seed(4)
    b = drop(x)
    assert torch.equal(a, b)
    assert isinstance(drop, torch.nn.Dropout)
    assert torch.equal(drop.eval()(x), x)
    drop.train().p = 0.0
    assert torch.equal(drop(x), x)


def test_dropout_gradient_is_the_mask():
    torch.manual_seed(2)
    x = torch.randn(50, 20, requires_grad=True)
    y = Dropout(0.25)(x)
    y.sum().backward()
    scale = 1 / (1 - 0.25)
    torch.testing.assert_close(x.grad, (y != 0).float() * scale)


def test_keep_freed_memory_changes_no_result():
    torch.manual_seed(3)
    a = torch.randn(2048, 4096) @ torch.randn(4096, 64)
    keep_freed_memory()  # True on glibc; a no-op elsewhere
    assert keep_freed_memory() in (True, False)
    torch.manual_seed(3)
    torch.testing.assert_close(torch.randn(2048, 4096) @ torch.randn(4096, 64), a)


@pytest.fixture
def blocked_here(monkeypatch):
    """VocabProjection blocks on this machine's CPU whatever its capability (BLOCKED_ON)."""
    from cometnmt.modules import output

    monkeypatch.setattr(output, "BLOCKED_ON", (torch.backends.cpu.get_cpu_capability(),))


def test_vocab_projection_blocks_only_on_the_cpus_named(monkeypatch):
    from cometnmt.modules import output

    proj, x = VocabProjection(16, 1500), torch.randn(3, 40, 16)
    monkeypatch.setattr(output, "BLOCKED_ON", (torch.backends.cpu.get_cpu_capability(),))
    assert proj._blocked(x)
    monkeypatch.setattr(output, "BLOCKED_ON", ())
    assert not proj._blocked(x)
    torch.testing.assert_close(proj(x), F.linear(x, proj.weight, proj.bias))


@pytest.mark.parametrize("bias", [True, False])
def test_vocab_projection_equals_linear(bias, blocked_here):
    torch.manual_seed(5)
    proj = VocabProjection(16, 1500, bias=bias)  # three 512-column blocks, the last one short
    x = torch.randn(3, 40, 16, requires_grad=True)
    assert proj._blocked(x)
    y = proj(x)
    ref = F.linear(x, proj.weight, proj.bias)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *proj.parameters()], g)
    ref_grads = torch.autograd.grad(ref, [x, *proj.parameters()], g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(proj(x), ref)


def test_vocab_projection_compiles_to_the_blocked_operator(blocked_here):
    """Under torch.compile the blocked product stays one opaque operator (``cometnmt::blocked_linear``)
    in one graph, and the compiled values and gradients equal F.linear's."""
    import torch._dynamo

    torch.manual_seed(6)
    proj = VocabProjection(16, 1500)
    x = torch.randn(3, 40, 16, requires_grad=True)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(proj)(x)
    assert explained.graph_break_count == 0
    assert "cometnmt.blocked_linear" in str(explained.graphs[0].graph)
    compiled = torch.compile(proj)
    y = compiled(x)
    ref = F.linear(x, proj.weight, proj.bias)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *proj.parameters()], g)
    for a, b in zip(grads, torch.autograd.grad(ref, [x, *proj.parameters()], g)):
        torch.testing.assert_close(a, b)
