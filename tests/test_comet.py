"""COMET-specific properties: the padding-invariance test has teeth (it fails when batch norm sees
padding), the convolution unit's shapes follow the paper, and the temporal-convolution decoder
keeps an O(kernel) cache."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

from cometnmt.models.comet import CometConfig, ConvUnit, GatedConv, MaskedBatchNorm, MultiLayerConv

import test_models
from conftest import state_buffers
from test_models import make, random_batch


@pytest.fixture
def leaky(monkeypatch):
    """Batch norm as a plain nn.BatchNorm1d does it: statistics over every position, padding included."""
    original = MaskedBatchNorm.forward

    def leaky_forward(self, x, pad_mask, lengths=None, padding=None):
        y = original(self, x, None, lengths)
        return y if pad_mask is None else y.masked_fill(pad_mask.unsqueeze(-1), 0.0)

    monkeypatch.setattr(MaskedBatchNorm, "forward", leaky_forward)


def test_invariance_test_fails_when_padding_leaks_into_batch_norm(leaky):
    """Batch statistics only exist in training mode, so the train-mode padding-invariance test is
    the one that must catch the leak (in eval mode batch norm uses running statistics)."""
    with pytest.raises(AssertionError):
        test_models.test_train_mode_padding_does_not_change_real_positions("comet")


def test_invariance_tests_fail_when_padding_is_not_zeroed_before_convolution(monkeypatch):
    from cometnmt.models import comet

    def no_zeroing(self, x, pad_mask, src_lengths=None, padding=None, weights=None):
        maps, h = [], x
        for conv, norm in zip(self.convs, self.norms):
            h = norm(conv(h), pad_mask)
            maps.append(h)
        return maps

    monkeypatch.setattr(comet.MultiLayerConv, "forward", no_zeroing)
    with pytest.raises(AssertionError):
        test_models.test_padding_invariance("comet")


def test_masked_training_batch_norm_centres_in_one_operator_with_the_same_numbers():
    """The padded training path centres x as kept - keep * mean (one addcmul) where it computed
    (x - mean) * keep (a subtraction and a product): one operator fewer a call, and the outputs,
    gradients and batch statistics equal, bit for bit, those of the formula written out."""
    from cometnmt.models.comet import _MaskedBatchNormTrain

    torch.manual_seed(4)
    x = torch.randn(3, 7, 5, requires_grad=True)  # B,L,C
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = pad[2, 3:] = True
    keep = (~pad).unsqueeze(-1).float()  # B,L,1
    n = keep.sum()
    weight, bias = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    probe = torch.randn(3, 7, 5)
    with _Ops() as seen:
        y, mean, var = _MaskedBatchNormTrain.apply(x, keep, n, weight, bias, 1e-5)
    assert seen.count.get("sub", 0) == 0 and seen.count["addcmul"] == 2, seen.count  # centring and the affine
    (y * probe).sum().backward()
    ours = [y.detach(), mean, var, x.grad, weight.grad, bias.grad]
    x.grad = weight.grad = bias.grad = None
    # the formula written out, autograd's backward (the Function's is the textbook one, to rounding)
    want_mean = (x * keep).sum(dim=(0, 1)) / n  # C
    centred = (x - want_mean) * keep  # B,L,C
    want_var = centred.square().sum(dim=(0, 1)) / n  # C
    want = torch.addcmul(bias, centred * torch.rsqrt(want_var + 1e-5), weight) * keep  # B,L,C
    assert torch.equal(ours[0], want) and torch.equal(ours[1], want_mean) and torch.equal(ours[2], want_var)
    (want * probe).sum().backward()
    for a, b in zip(ours[3:], (x.grad, weight.grad, bias.grad)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_masked_batch_norm_matches_batch_norm_on_real_tokens():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 5)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = pad[2, 3:] = True
    ours = MaskedBatchNorm(5).train()
    ref = torch.nn.BatchNorm1d(5).train()
    y = ours(x, pad)
    expected = ref(x[~pad])  # N,C over real tokens only
    torch.testing.assert_close(y[~pad], expected, atol=1e-5, rtol=1e-5)
    assert y[pad].abs().max() == 0
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)


def test_masked_batch_norm_gradients_match_batch_norm_on_real_tokens():
    """The hand-written backward of the training-mode batch norm: the gradients of the input, the
    scale and the shift equal autograd's through nn.BatchNorm1d on the real tokens; padding gets none."""
    torch.manual_seed(1)
    x = torch.randn(4, 6, 5, requires_grad=True)
    pad = torch.zeros(4, 6, dtype=torch.bool)
    pad[1, 2:] = pad[3, 5:] = True
    probe = torch.randn(4, 6, 5)
    ours = MaskedBatchNorm(5).train()
    ref = torch.nn.BatchNorm1d(5).train()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5), ours.bias.uniform_(-0.5, 0.5)
        ref.weight.copy_(ours.weight), ref.bias.copy_(ours.bias)
    (ours(x, pad) * probe).sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    (ref(x_ref[~pad]) * probe[~pad]).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    assert x.grad[pad].abs().max() == 0
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad, atol=1e-5, rtol=1e-5)
    # bf16 input (autocast on a GPU): the gradient comes back in the input's dtype
    xb = torch.randn(2, 3, 5, dtype=torch.bfloat16, requires_grad=True)
    ours(xb, None).sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and ours(xb, None).dtype == torch.float32


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dilation", [1, 2, 3])
def test_gated_conv_equals_conv1d(causal, dilation):
    """The im2col matrix product is eq. 3's convolution: F.conv1d with l (or, causal, 2l on the
    left) zeros of padding, then tanh of one half times sigmoid of the other."""
    torch.manual_seed(dilation)
    conv = GatedConv(6, 4, 3, dilation, causal)
    x = torch.randn(2, 9, 6)
    pad = (2 * dilation, 0) if causal else (dilation, dilation)
    h = torch.nn.functional.conv1d(torch.nn.functional.pad(x.transpose(1, 2), pad), conv.conv.weight, conv.conv.bias,
                                   dilation=dilation)  # B,2n_f,L
    expected = (torch.tanh(h[:, :4]) * torch.sigmoid(h[:, 4:])).transpose(1, 2)
    torch.testing.assert_close(conv(x), expected, atol=1e-6, rtol=1e-5)
    # the GPU's path (one F.conv1d) gives the same outputs and gradients as im2col
    x.requires_grad_(True)
    probe = torch.randn_like(expected)
    grads = []
    for use_conv1d in (False, True):
        conv.use_conv1d = use_conv1d
        x.grad = None
        conv.zero_grad()
        (conv(x) * probe).sum().backward()
        grads.append((x.grad.clone(), conv.conv.weight.grad.clone(), conv.conv.bias.grad.clone()))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    conv.use_conv1d = None
    x = x.detach()
    if causal:  # the incremental step gives the same outputs
        history, outs = None, []
        for t in range(x.size(1)):
            y, history = conv.step(x[:, t : t + 1], history)
            outs.append(y)
        torch.testing.assert_close(torch.cat(outs, dim=1), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device (scripts/gpu_session.sh check runs it on one)"))])
@pytest.mark.parametrize("causal", [False, True])
def test_gated_conv1d_function_equals_autograd_through_conv_and_gate(causal, device):
    """The GPU path's training forward (``_GatedConv1d``: conv, in-place tanh and glu, the backward
    written out) gives autograd's outputs and gradients through F.conv1d, tanh, sigmoid and mul: in
    float32 to rounding, and under bf16 autocast (a float32 input, as the encoder's first
    convolution gets, or a bf16 one) in the same dtypes and close to them; float64 stays float64.
    On CUDA too, where it trains (cuDNN's kernels; TF32 kept off for the float32 comparison)."""
    if device == "cuda":
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            _check_gated_conv1d_function(causal, device)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
    else:
        _check_gated_conv1d_function(causal, device)


def _check_gated_conv1d_function(causal: bool, device: str) -> None:
    torch.manual_seed(3)
    conv = GatedConv(6, 4, 3, 2, causal).to(device)
    pad = (4, 0) if causal else (2, 2)

    def reference(x):
        h = torch.nn.functional.conv1d(torch.nn.functional.pad(x, pad), conv.conv.weight, conv.conv.bias, dilation=2)
        return torch.tanh(h[:, :4]) * torch.sigmoid(h[:, 4:])

    def run(f, x, probe, bf16=False):
        x = x.clone().requires_grad_(True)
        conv.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            y = f(x)
        (y.float() * probe).sum().backward()
        return [y, x.grad, conv.conv.weight.grad, conv.conv.bias.grad]

    x = torch.randn(3, 6, 9, device=device)  # B,C_in,L
    probe = torch.randn(3, 4, 9, device=device)
    for dtype, bf16, tol in ((torch.float32, False, 1e-6 if device == "cpu" else 1e-5), (torch.float32, True, 2e-2), (torch.bfloat16, True, 2e-2)):
        # fused_gate False (bench.py's comet@unfused): autograd through F.conv1d and the gate, the same values
        for fused in (True, False):
            conv.fused_gate = fused
            ours, ref = run(conv.forward_channels_first, x.to(dtype), probe, bf16), run(reference, x.to(dtype), probe, bf16)
            # the Function, or autograd's ops (the gate's product last) where switched off
            assert type(ours[0].grad_fn).__name__ == ("_GatedConv1dBackward" if fused else "MulBackward0"), fused
            for a, b, name in zip(ours, ref, ("y", "x.grad", "weight.grad", "bias.grad")):
                assert a.dtype == b.dtype, (dtype, bf16, fused, name)
                torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol, msg=f"{dtype} bf16={bf16} fused={fused} {name}")
    conv.fused_gate = True
    conv.double()
    ours, ref = run(conv.forward_channels_first, x.double(), probe.double()), run(reference, x.double(), probe.double())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    ours = run(conv.forward_channels_first, x.double(), probe.double(), bf16=True)  # autocast leaves float64 alone
    assert ours[0].dtype == torch.float64


def test_conv_unit_shapes_follow_the_paper():
    unit = ConvUnit(256, CometConfig(), dropout=0.1)
    widths = [c.conv.out_channels // 2 for c in unit.convs.convs]
    dilations = [c.conv.dilation[0] for c in unit.convs.convs]
    kernels = [c.conv.kernel_size[0] for c in unit.convs.convs]
    assert (widths, dilations, kernels) == ([64, 32, 16], [1, 2, 3], [3, 3, 3])
    assert (unit.reduce.in_features, unit.reduce.out_features) == (256 + 112, 256)
    x = torch.randn(2, 9, 256)
    assert unit(x, torch.zeros(2, 9, dtype=torch.bool)).shape == (2, 9, 256)
    pre = []
    unit.reduce.register_forward_hook(lambda module, args, out: pre.append(out))
    y = unit(x)  # the leaky ReLU (slope 0.01) of the projection back to d_m
    torch.testing.assert_close(y, torch.nn.functional.leaky_relu(pre[-1], 0.01))
    assert (pre[-1] < 0).any()


def test_temporal_convolution_cache_is_bounded():
    model = make("comet_temporal").eval()
    src, mask = random_batch([5, 7], 23, torch.Generator().manual_seed(0))
    state = model.init_state(model.encode(src, mask))
    tokens = torch.tensor([2, 2])
    sizes = []
    for _ in range(12):
        _, state = model.step(tokens, state)
        sizes.append([state["units"][0]["ffn"][f"conv{i}"].numel() for i in range(3)])
    # kernel 3, dilations 1, 2, 3: the caches hold (K-1)*l = 2, 4, 6 past inputs of width 32, 64, 32
    # (d_model, F1, F2) for each of the 2 sentences, whatever the prefix length.
    assert all(s == [2 * 32 * 2, 2 * 64 * 4, 2 * 32 * 6] for s in sizes)


def test_length_bucketed_batch_norm_updates_the_batch_bucket_and_normalises_by_own_length():
    """comet.bn_length_bounds: a training batch moves its mean length's statistics and the pooled
    ones, nothing else; in evaluation each sentence is normalised with its own length's (the pooled
    ones where no training batch reached its bucket), exactly as a plain MaskedBatchNorm holding
    those statistics would."""
    torch.manual_seed(0)
    norm = MaskedBatchNorm(4, length_bounds=[3, 6]).train()  # buckets <= 3, 4-6, > 6
    x = torch.randn(2, 5, 4) * 3 + 1
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 4:] = True  # lengths 5 and 4: mean 4.5, rounds to 4 (not 5: torch.round is half-to-even)
    norm(x, pad)
    moved = (norm.running_mean != 0).any(dim=1).tolist()
    assert moved == [False, True, False, True] and norm.bucket_batches.tolist() == [0, 1, 0, 1]
    assert norm.running_var[0].eq(1).all() and norm.running_var[2].eq(1).all()
    # the first batch of a bucket sets its statistics (no blend with the initial 0 / 1)
    real = x[~pad]
    torch.testing.assert_close(norm.running_mean[1], real.mean(0))
    torch.testing.assert_close(norm.running_var[1], real.var(0))
    norm(torch.randn(3, 9, 4) + 5, None)  # 9 positions: the last bucket
    assert (norm.running_mean != 0).any(dim=1).tolist() == [False, True, True, True]
    assert norm.bucket_batches.tolist() == [0, 1, 1, 2]

    norm.eval()
    lengths = [2, 5, 8]
    x = torch.randn(3, 8, 4)
    pad = torch.arange(8).expand(3, 8) >= torch.tensor(lengths).unsqueeze(1)
    y = norm(x, pad)
    for i, bucket in enumerate([3, 1, 2]):  # length 2: bucket 0, never trained: the pooled row
        plain = MaskedBatchNorm(4).eval()
        plain.load_state_dict({"weight": norm.weight, "bias": norm.bias, "running_mean": norm.running_mean[bucket],
                               "running_var": norm.running_var[bucket]})
        torch.testing.assert_close(y[i : i + 1], plain(x[i : i + 1], pad[i : i + 1]))


def test_length_buckets_only_in_the_encoder_and_bad_bounds_are_refused():
    from cometnmt.config import ModelConfig, from_dict
    from cometnmt.models import build_model

    cfg = from_dict(ModelConfig, {"arch": "comet", "d_model": 32, "n_heads": 4, "enc_layers": 1, "dec_layers": 1,
                                  "d_ff": 64, "comet": {"decoder": "temporal_conv", "bn_length_bounds": [8, 11]}}, "model")
    model = build_model(cfg, 20, 20, 0)
    shapes = {name: m.running_mean.shape for name, m in model.named_modules() if isinstance(m, MaskedBatchNorm)}
    assert shapes and all((s == (4, n)) == name.startswith("encoder") for name, s in shapes.items() for n in [s[-1]])
    for bad in ([11, 8], [0, 4], [5, 5]):
        with pytest.raises(ValueError, match="comet.bn_length_bounds"):
            MaskedBatchNorm(4, length_bounds=bad)


@pytest.mark.parametrize("decoder_batch_norm", [True, False])
def test_training_mode_decoder_batch_norm_lets_later_targets_reach_earlier_positions(decoder_batch_norm):
    """The temporal-convolution decoder is causal in its convolutions and attention, but in training
    its batch norm normalises with statistics over the whole batch of teacher-forced targets: a
    position's output then moves when a later target token (of its own sentence or of another)
    changes. comet.decoder_batch_norm: false removes that path, and with it the dependence."""
    from cometnmt.config import ModelConfig, from_dict
    from cometnmt.models import build_model

    cfg = from_dict(ModelConfig, {"arch": "comet", "d_model": 32, "n_heads": 4, "enc_layers": 1, "dec_layers": 2,
                                  "d_ff": 64, "dropout": 0.0,
                                  "comet": {"decoder": "temporal_conv", "decoder_batch_norm": decoder_batch_norm}}, "model")
    torch.manual_seed(0)
    model = build_model(cfg, 20, 20, 0).train()
    assert any(isinstance(m, MaskedBatchNorm) for m in model.decoder.modules()) == decoder_batch_norm
    assert any(isinstance(m, MaskedBatchNorm) for m in model.encoder.modules())  # the encoder keeps its own
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(4, 20, (2, 6), generator=gen)
    tgt = torch.randint(4, 20, (2, 7), generator=gen)
    changed = tgt.clone()
    changed[0, 5:] = (changed[0, 5:] + 1 - 4) % 16 + 4  # later tokens of sentence 0
    changed[1, :] = (changed[1, :] + 1 - 4) % 16 + 4  # every token of sentence 1
    pad = src.eq(0)
    with torch.no_grad():
        before = model(src, pad, tgt)[0, :5]  # positions 0-4 of sentence 0 see only tokens 0-4
        after = model(src, pad, changed)[0, :5]
    if decoder_batch_norm:
        assert not torch.allclose(before, after, atol=1e-6)
    else:
        torch.testing.assert_close(before, after, rtol=0, atol=1e-6)


def test_decoder_batch_norm_off_needs_a_temporal_convolution_decoder():
    from cometnmt.errors import ConfigError

    with pytest.raises(ConfigError, match="model.comet.decoder_batch_norm"):
        CometConfig(decoder_batch_norm=False)
    assert CometConfig(decoder="temporal_conv", decoder_batch_norm=False).decoder_batch_norm is False


def test_decoder_length_buckets_need_a_decoder_batch_norm_to_key():
    from cometnmt.errors import ConfigError

    for kwargs in ({}, {"decoder": "temporal_conv", "decoder_batch_norm": False},
                   {"decoder": "temporal_conv", "batch_norm": False}):
        with pytest.raises(ConfigError, match="model.comet.decoder_bn_length_bounds"):
            CometConfig(decoder_bn_length_bounds=[8, 11], **kwargs)
    with pytest.raises(ConfigError, match="model.comet.decoder_bn_length_bounds.*ascending"):
        CometConfig(decoder="temporal_conv", decoder_bn_length_bounds=[11, 8])
    assert CometConfig(decoder="temporal_conv", decoder_bn_length_bounds=[8, 11]).decoder_bn_length_bounds == [8, 11]


def test_decoder_length_buckets_follow_the_source_length():
    """comet.decoder_bn_length_bounds: a training batch moves the decoder's statistics of its mean
    *source* length's bucket, whatever its targets' lengths (padded or not), and the encoder keeps one
    set. In evaluation each sentence's decoder is normalised with its source length's statistics:
    moving one bucket's statistics changes the logits of exactly the sentences whose source length
    falls in it, in the full decode and in the incremental step alike."""
    from cometnmt.config import ModelConfig, from_dict
    from cometnmt.models import build_model

    cfg = from_dict(ModelConfig, {"arch": "comet", "d_model": 32, "n_heads": 4, "enc_layers": 1, "dec_layers": 2,
                                  "d_ff": 64, "dropout": 0.0,
                                  "comet": {"decoder": "temporal_conv", "decoder_bn_length_bounds": [4, 8]}}, "model")
    torch.manual_seed(0)
    model = build_model(cfg, 20, 20, 0).train()
    dec = [m for m in model.decoder.modules() if isinstance(m, MaskedBatchNorm)]
    enc = [m for m in model.encoder.modules() if isinstance(m, MaskedBatchNorm)]
    assert len(dec) == 2 * 3 and all(m.running_mean.shape[0] == 4 for m in dec)  # 3 buckets and the pooled row
    assert enc and all(m.running_mean.dim() == 1 for m in enc)
    gen = torch.Generator().manual_seed(1)
    steps = [  # (source lengths, target lengths) -> the decoder's bucket counts after the batch
        (([2, 3], [10, 9]), [1, 0, 0, 1]),  # mean source length 2.5 (rounds to 2): bucket <= 4; padded targets of 9-10
        (([10, 10], [3, 3]), [1, 0, 1, 2]),  # unpadded source and targets (the unpadded path): bucket > 8, not 3's
        (([6, 6], [2, 9]), [1, 1, 1, 3]),  # bucket 5-8
    ]
    with torch.no_grad():
        for (src_lengths, tgt_lengths), counts in steps:
            src, mask = random_batch(src_lengths, 20, gen)
            tgt, _ = random_batch(tgt_lengths, 20, gen)
            model(src, mask, tgt)
            assert all(m.bucket_batches.tolist() == counts for m in dec)
    model.eval()
    src, mask = random_batch([3, 6, 11], 20, gen)  # one sentence in each bucket
    tgt, _ = random_batch([7, 7, 7], 20, gen)
    tgt[:, 0] = 2

    def logits():
        with torch.no_grad():
            mem = model.encode(src, mask)
            full = model.decode(tgt, mem)
            state, steps = model.init_state(mem), []
            for t in range(tgt.size(1)):
                out, state = model.step(tgt[:, t], state)
                steps.append(out)
        torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)
        return full

    base = logits()
    for bucket in range(3):
        saved = [m.running_mean.clone() for m in dec]
        for m in dec:
            m.running_mean[bucket] += 0.5
        moved = logits()
        for m, keep in zip(dec, saved):
            m.running_mean.copy_(keep)
        changed = [not torch.allclose(moved[i], base[i]) for i in range(3)]
        assert changed == [i == bucket for i in range(3)]


def test_length_buckets_do_not_change_training():
    """Per-length statistics are bookkeeping: in training, batch norm normalises with the batch's
    own statistics and no random numbers are drawn for the buckets, so COMET with and without
    comet.bn_length_bounds takes the same steps from the same seed (dropout on). This is what makes
    scripts/bn_length_ablation.py a clean control."""
    models = [make("comet", seed=3), make("comet_bn_length", seed=3)]
    gen = torch.Generator().manual_seed(5)
    batches = [(random_batch(s, test_models.V_SRC, gen), random_batch(t, test_models.V_TGT, gen)[0])
               for s, t in [([7, 4, 9], [6, 8, 3]), ([2, 3, 2, 3], [3, 2, 4, 2]), ([12, 11], [10, 13])] * 2]
    losses = []
    for model in models:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        torch.manual_seed(11)  # the same dropout masks for both
        model.train()
        trace = []
        for (src, mask), tgt in batches:
            loss = model(src, mask, tgt).float().logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            trace.append(loss.item())
        losses.append(trace)
    assert losses[0] == losses[1]
    a, b = (dict(m.named_parameters()) for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bn_length_ablation_pools_every_sentence_and_restores_the_buckets():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bn_length_ablation.py"
    spec = importlib.util.spec_from_file_location("bn_length_ablation", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    torch.manual_seed(0)
    norm = MaskedBatchNorm(4, length_bounds=[4, 8]).train()
    norm(torch.randn(3, 3, 4) + 2, None)  # length 3: bucket <= 4
    norm(torch.randn(3, 10, 4) - 1, None)  # length 10: bucket > 8
    norm.eval()
    counts = norm.bucket_batches.clone()
    x = torch.randn(2, 10, 4)
    pad = torch.arange(10).expand(2, 10) >= torch.tensor([[3], [10]])  # lengths 3 and 10
    per_length = norm(x, pad)
    plain = MaskedBatchNorm(4).eval()
    plain.load_state_dict({"weight": norm.weight, "bias": norm.bias, "running_mean": norm.running_mean[-1],
                           "running_var": norm.running_var[-1]})
    with script.pooled_statistics(norm):
        torch.testing.assert_close(norm(x, pad), plain(x, pad))
    assert torch.equal(norm.bucket_batches, counts)
    for i in range(2):  # outside the context: each sentence with its own bucket's statistics again
        assert not torch.allclose(per_length[i], plain(x, pad)[i])
        torch.testing.assert_close(norm(x, pad)[i], per_length[i])
    assert script.bucket_labels([8, 11]) == [("1-8", 1, 8), ("9-11", 9, 11), ("12+", 12, 10**6)]


@pytest.mark.parametrize("bounds", [None, [4, 8]])
def test_unpadded_batch_norm_is_pytorchs_own_with_the_same_results(bounds):
    """A training batch without padding (pad_mask None) runs F.batch_norm: the same outputs,
    gradients and running statistics (per length too) as the masked path given an all-False mask."""
    torch.manual_seed(3)
    x = (torch.randn(4, 6, 5) * 2 + 1).requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    probe = torch.randn(4, 6, 5)
    masked, native = MaskedBatchNorm(5, length_bounds=bounds).train(), MaskedBatchNorm(5, length_bounds=bounds).train()
    with torch.no_grad():
        masked.weight.uniform_(0.5, 1.5), masked.bias.uniform_(-0.5, 0.5)
        native.weight.copy_(masked.weight), native.bias.copy_(masked.bias)
    for step in range(2):  # the second batch blends into the running statistics
        y = masked(x, torch.zeros(4, 6, dtype=torch.bool))
        y2 = native(x2, None)
        assert y2.dtype == torch.float32
        torch.testing.assert_close(y2, y, atol=1e-5, rtol=1e-5)
        (y * probe).sum().backward()
        (y2 * probe).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(native.weight.grad, masked.weight.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(native.bias.grad, masked.bias.grad, atol=1e-5, rtol=1e-5)
    for (k, a), (_, b) in zip(state_buffers(masked), state_buffers(native)):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=k)
    if bounds:
        assert native.bucket_batches.tolist() == [0, 2, 0, 2]  # length 6: bucket 4-8, and the pooled row
    one = MaskedBatchNorm(5).train()  # one position: no batch statistics to speak of, the masked path
    assert one(torch.randn(1, 1, 5), None).abs().max() < 1e-4


def test_per_length_statistics_picked_on_the_host_equal_the_device_path_and_follow_outside_writes():
    """Unpadded batches move the per-length statistics with weights computed on the host, from a host
    copy of bucket_batches (fewer operators a step): bit for bit what the device path (the same
    batches' lengths given as tensors) computes, through the first updates (weights 1/count, the
    bucket and the pooled row apart), the steady state (both at momentum: one lerp_ on two rows),
    a padded batch (the device path) in between, and writes to the counts from outside (a
    checkpoint loaded, bn_length_ablation.py's zeroing), which the host copy must not miss."""
    host, device = (MaskedBatchNorm(3, length_bounds=[4, 8]).train() for _ in range(2))
    g = torch.Generator().manual_seed(0)
    for i in range(30):
        L = [3, 6, 11, 6][i % 4]
        x = torch.randn(2, L, 3, generator=g) * (1 + L / 4) + L
        pad = torch.zeros(2, L, dtype=torch.bool)
        pad[0, -1] = True  # used in batch 13 only: both modules take the device path
        pad = pad if i == 13 else None
        host(x, pad)
        device(x, pad, lengths=torch.full((2,), L) if pad is None else None)  # lengths as a tensor: the device path
        if i == 20:  # a checkpoint with other counts is loaded into both
            state = {k: v.clone() for k, v in host.state_dict().items()}
            state["bucket_batches"][1] = 2  # a bucket that goes back to 1/count weights
            host.load_state_dict(state), device.load_state_dict(state)
        if i == 25:  # written in place from outside, as bn_length_ablation.py does
            host.bucket_batches[:-1] = 0
            device.bucket_batches[:-1] = 0
        for k in ("running_mean", "running_var", "bucket_batches"):
            assert torch.equal(getattr(host, k), getattr(device, k)), (i, k)
    assert host.bucket_batches.tolist() == [1, 2, 1, 30]  # buckets zeroed after batch 25, then lengths 11, 6, 3, 6


@pytest.mark.parametrize("bounds,kind,causal", [(None, "conv", False), ([4, 8], "conv", False), (None, "ffn1", False),
                                                 ([4, 8], "ffn2", False), (None, "conv", True), ([4, 8], "conv", True)])
def test_channels_first_training_path_equals_the_masked_path(bounds, kind, causal):
    """On the GPU (F.conv1d) an unpadded training batch runs the convolution stack in B,C,L with
    batch norm in the convolution's dtype: the same outputs, gradients and running statistics (per
    length too) as the B,L,C path given an all-False mask, for the encoder's units and the temporal
    convolution of the decoder (its per-length statistics keyed by given source lengths); under bf16
    autocast, close to them."""
    torch.manual_seed(5)
    cfg = CometConfig(bn_length_bounds=None if causal else bounds, unit=kind, ffn1_hidden=16, ffn2_hidden=16,
                      decoder="temporal_conv" if causal else "ffn", decoder_bn_length_bounds=bounds if causal else None)
    src_lengths = torch.tensor([9, 12, 10]) if causal and bounds else None  # mean 10.3: the bucket > 8, not x's length 7
    units = [ConvUnit(8, cfg, dropout=0.0, causal=causal).train() for _ in range(2)]
    units[1].load_state_dict(units[0].state_dict())
    for unit in units:
        for m in unit.modules():
            if isinstance(m, GatedConv):
                m.use_conv1d = True
    x = torch.randn(3, 7, 8)
    probe = torch.randn(3, 7, 8)
    calls = []
    original = MultiLayerConv._train_channels_first

    def spy(self, h, lengths=None, weights=None):
        calls.append(h.shape)
        return original(self, h, lengths, weights)

    results = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MultiLayerConv, "_train_channels_first", spy)
        for unit, mask in zip(units, (torch.zeros(3, 7, dtype=torch.bool), None)):
            xi = x.clone().requires_grad_(True)
            for _ in range(2):  # the second batch blends into the running statistics
                y = unit(xi, mask, src_lengths)
                (y * probe).sum().backward()
            results.append((y.detach(), xi.grad, {k: p.grad for k, p in unit.named_parameters()}))
    assert len(calls) == 2  # the unpadded unit took the channels-first path, the masked one did not
    (y0, gx0, g0), (y1, gx1, g1) = results
    torch.testing.assert_close(y1, y0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx1, gx0, atol=1e-5, rtol=1e-4)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=1e-5, rtol=1e-4, msg=k)
    for (k, a), (_, b) in zip(state_buffers(units[0]), state_buffers(units[1])):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=k)
    if bounds:  # the batch's bucket (its own length 7 in the encoder, its mean source length in the decoder) and the pooled row
        expected = [0, 0, 2, 2] if causal else [0, 2, 0, 2]
        assert all(m.bucket_batches.tolist() == expected for m in units[1].modules() if isinstance(m, MaskedBatchNorm))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16: the same up to bf16 rounding
        y_bf16 = units[1](x, None, src_lengths)
        y_ref = units[0](x, torch.zeros(3, 7, dtype=torch.bool), src_lengths)
    torch.testing.assert_close(y_bf16.float(), y_ref.float(), atol=0.05, rtol=0.05)


class _Casts(torch.utils._python_dispatch.TorchDispatchMode):
    """The dtype casts (``_to_copy``) a block dispatches, as (shape, from dtype, to dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "_to_copy":
            self.seen.append((tuple(args[0].shape), args[0].dtype, out.dtype))
        return out


@pytest.mark.parametrize("kind,features,dilations", [("conv", [6, 4, 2], [1, 2, 3]), ("ffn2", [6, 4, 2], [1, 2, 3]),
                                                     ("conv", [6, 4, 2, 2], [1, 2, 3, 4])])
def test_channels_first_unit_casts_its_input_once_under_autocast(kind, features, dilations):
    """Under bf16 autocast the unpadded GPU path (F.conv1d) casts the unit's float32 input to bf16
    once, for the first convolution and the concatenation together, and its gradient back once:
    the same outputs, gradients and running statistics, bit for bit, as a cast for each of them."""
    torch.manual_seed(6)
    cfg = CometConfig(features=features, dilations=dilations, unit=kind, ffn2_hidden=16)
    units = [ConvUnit(8, cfg, dropout=0.0).train() for _ in range(3)]
    for unit in units[1:]:
        unit.load_state_dict(units[0].state_dict())
    units[2].cast_once = False  # bench.py's comet@unfused: forward casts as the reference does
    for m in (m for unit in units for m in unit.modules()):
        if isinstance(m, GatedConv):
            m.use_conv1d = True
    x = torch.randn(3, 7, 8)
    probe_bf16 = torch.randn(3, 7, 8).bfloat16()
    results, casts = [], []
    for i, unit in enumerate(units):
        xi = x.clone().requires_grad_(True)
        for _ in range(2):  # the second batch blends into the running statistics
            with _Casts() as seen:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    # units[1]: a cast for each consumer of x, as the unit did before
                    y = unit(xi) if i != 1 else unit.combine(unit.convs(xi, None), xi)
                (y * probe_bf16).sum().backward()  # no cast of y's shape, only of x's
            casts.append([c for c in seen.seen if c[0] in ((3, 7, 8), (3, 8, 7))])  # x's, in either layout
        results.append((y.detach(), xi.grad, {k: p.grad for k, p in unit.named_parameters()}))
    (y0, gx0, g0) = results[0]
    for j, (y1, gx1, g1) in enumerate(results[1:], 1):
        assert torch.equal(y0, y1), j
        assert torch.equal(gx0, gx1), j
        for k in g0:
            assert torch.equal(g0[k], g1[k]), (j, k)
        for (k, a), (_, b) in zip(state_buffers(units[0]), state_buffers(units[j])):
            assert torch.equal(a, b), (j, k)
    one_each_way = [((3, 7, 8), torch.float32, torch.bfloat16), ((3, 7, 8), torch.bfloat16, torch.float32)]
    assert casts[0] == casts[1] == one_each_way  # the unit, both batches
    assert len(casts[2]) == 4  # the reference: x cast forward and its gradient back, twice each
    assert casts[4] == casts[5] == casts[2]  # cast_once switched off: the reference's casts


@pytest.mark.parametrize("kind", ["conv", "ffn2"])
def test_a_unit_without_batch_norm_casts_its_input_not_its_maps_under_autocast(kind):
    """ConvUnit.combine's cast of x to the maps' dtype was reviewed as unreachable (forward casts x
    on the channels-first path). It is reached: with comet.batch_norm false the maps stay in the
    convolutions' bf16 while x is float32, in training and evaluation, padded or not. There it casts
    x once, where the concatenation would promote every map to float32 and cast the joined tensor
    back to bf16 for the linear: the same output, bit for bit, with one cast instead of four."""
    torch.manual_seed(8)
    unit = ConvUnit(8, CometConfig(features=[6, 4, 2], dilations=[1, 2, 3], unit=kind, ffn2_hidden=16,
                                   batch_norm=False), dropout=0.0)
    x = torch.randn(3, 7, 8)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True
    for training, pad_mask in ((True, None), (True, pad), (False, pad)):
        unit.train(training)
        with _Casts() as seen, torch.autocast("cpu", dtype=torch.bfloat16):
            maps = unit.convs(x, pad_mask)
            y = unit.combine(maps, x)
        assert {m.dtype for m in maps} == {torch.bfloat16} and x.dtype == torch.float32
        assert ((3, 7, 8), torch.float32, torch.bfloat16) in seen.seen  # x, once
        assert not [c for c in seen.seen if c[1] == torch.bfloat16]  # no map widened to float32
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the promoting concatenation, as without the cast
            joined = torch.cat([*maps, x], dim=-1)  # B,L,20 (float32)
            want = unit.reduce(joined) if kind == "ffn2" else torch.nn.functional.leaky_relu(unit.reduce(joined), unit.slope)
            whole = unit(x, pad_mask)  # forward: the same maps and combine
        assert torch.equal(y, want) and torch.equal(whole, y)


@pytest.mark.parametrize("kind", ["conv", "ffn1", "ffn2"])
@pytest.mark.parametrize("bounds", [None, [4, 6]])
def test_a_float64_unit_trains_under_bf16_autocast_in_float64(kind, bounds):
    """Training batch norm computed its statistics in float32 whatever its input: a float64 unit
    (model.double()) failed in training, with or without CPU bf16 autocast, with 'mixed dtype (CPU):
    expect parameter to have scalar type of Float' (F.batch_norm of the float32 maps with float64
    weights) or, padded, 'mat1 and mat2 must have the same dtype, but got BFloat16 and Double' (the
    float32 map, cast by autocast, meeting the next convolution's float64 weight). Autocast keeps
    float64 for F.linear and F.conv1d; the unit now does too: under autocast it gives the same
    float64 output and gradients as without, on both convolution paths, padded or not, and they
    agree with the float32 unit."""
    torch.manual_seed(9)
    unit = ConvUnit(8, CometConfig(features=[6, 4], dilations=[1, 2], unit=kind, ffn1_hidden=8, ffn2_hidden=16,
                                   bn_length_bounds=bounds), dropout=0.0)
    x = torch.randn(3, 7, 8)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True

    def run(module, x, pad_mask, bf16):
        x = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = module(x, pad_mask)
        y.backward(torch.ones_like(y))
        return [y, x.grad, *(p.grad for p in module.parameters())]

    for use_conv1d, pad_mask in ((False, None), (False, pad), (True, None), (True, pad)):
        unit64 = copy.deepcopy(unit).double().train()
        plain, unit32 = copy.deepcopy(unit64), copy.deepcopy(unit).train()
        for module in (unit64, plain, unit32):
            for conv in module.convs.convs:
                conv.use_conv1d = use_conv1d
        got = run(unit64, x.double(), pad_mask, bf16=True)
        assert all(t.dtype == torch.float64 for t in got), (use_conv1d, pad_mask is not None)
        want = run(plain, x.double(), pad_mask, bf16=False)
        assert all(torch.equal(a, b) for a, b in zip(got, want))  # autocast leaves float64 alone
        for a, b in zip(got, run(unit32, x, pad_mask, bf16=False)):
            torch.testing.assert_close(a.float(), b, atol=1e-4, rtol=1e-4)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """How many times each ATen operator a block dispatches; ``views=False``: views apart, as
    bench/count_ops.py counts (no kernel)."""

    def __init__(self, views: bool = True) -> None:
        super().__init__()
        self.count = {}
        self.views = views

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.views or not (func.is_view or name == "_unsafe_view"):
            self.count[name] = self.count.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("use_conv1d", [False, True])
@pytest.mark.parametrize("features,bounds,causal", [([6, 4, 2], None, False), ([6, 4, 2], [4, 6], False),
                                                    ([6, 4, 2, 2], None, False), ([6, 4, 2], [9, 11], True)])
def test_padding_statistics_shared_by_the_norms_of_a_unit_change_nothing(features, bounds, causal, use_conv1d):
    """On a padded training batch the norms of a unit share one PaddingStatistics (the pad mask's
    inverse, count of real positions, mean length), computed once per forward: float32 outputs,
    gradients and running statistics (per length too, the decoder's keyed by source lengths) equal
    those of norms that each compute their own, and the mask is inverted once, not once a norm."""
    torch.manual_seed(7)
    cfg = CometConfig(features=features, dilations=[1, 2, 3, 4][: len(features)], bn_length_bounds=None if causal else bounds,
                      decoder="temporal_conv" if causal else "ffn", decoder_bn_length_bounds=bounds if causal else None)
    units = [ConvUnit(8, cfg, dropout=0.0, causal=causal).train() for _ in range(2)]
    units[1].load_state_dict(units[0].state_dict())
    for m in (m for unit in units for m in unit.modules()):
        if isinstance(m, GatedConv):
            m.use_conv1d = use_conv1d
    src_lengths = torch.tensor([9, 12, 10, 11]) if causal and bounds else None

    def norms_on_their_own(unit, x, pad):  # MultiLayerConv.forward with no statistics passed to the norms
        stack, h, maps = unit.convs, x.masked_fill(pad.unsqueeze(-1), 0.0), []
        for conv, norm in zip(stack.convs, stack.norms):
            h = norm(conv(h), pad, src_lengths if stack.wants_source_lengths else None)
            maps.append(h)
        return unit.combine(maps, x)

    x = torch.randn(4, 7, 8) * 2 + 0.5
    pad = torch.zeros(4, 7, dtype=torch.bool)
    pad[0, 5:] = pad[2, 3:] = True
    probe = torch.randn(4, 7, 8)
    results, ops = [], []
    for i, unit in enumerate(units):
        xi = x.clone().requires_grad_(True)
        for _ in range(2):  # the second batch blends into the running statistics
            with _Ops() as seen:
                y = unit(xi, pad, src_lengths) if i == 0 else norms_on_their_own(unit, xi, pad)
            ops.append(seen.count)
            (y * probe).sum().backward()
        results.append((y.detach(), xi.grad, {k: p.grad for k, p in unit.named_parameters()}))
    (y0, gx0, g0), (y1, gx1, g1) = results
    assert y0.dtype == torch.float32 and torch.equal(y0, y1)
    assert torch.equal(gx0, gx1)
    for k in g0:
        assert torch.equal(g0[k], g1[k]), k
    buffers = [(k, a, b) for (k, a), (_, b) in zip(state_buffers(units[0]), state_buffers(units[1]))]
    assert any(k.endswith("running_var") for k, _, _ in buffers)
    for k, a, b in buffers:
        assert torch.equal(a, b), k
    if bounds:
        assert any(k.endswith("bucket_batches") and a.sum() > 0 for k, a, _ in buffers)
    assert ops[0]["bitwise_not"] == 1 and ops[2]["bitwise_not"] == len(features)
    # eval mode (running statistics): the same outputs
    units[0].eval(), units[1].eval()
    with torch.no_grad():
        assert torch.equal(units[0](x, pad, src_lengths), norms_on_their_own(units[1], x, pad))


@pytest.mark.parametrize("comet", [{}, {"bn_length_bounds": [4, 8]}, {"unit": "ffn1"},
                                   {"decoder": "temporal_conv", "decoder_bn_length_bounds": [4, 8]}])
def test_padding_derived_once_a_forward_not_once_a_unit_changes_nothing(monkeypatch, comet):
    """Transformer.encode and decode derive the masked batch norms' padding (SharedPadding) once a
    forward and give it to every unit: on padded batches the logits in evaluation, and the loss,
    gradients and running statistics in training, equal bit for bit those of units that each derive
    their own (as before), and the pad mask is inverted once a stack, not once a unit."""
    from cometnmt.config import ModelConfig, from_dict
    from cometnmt.models import build_model, transformer

    cfg = from_dict(ModelConfig, {"arch": "comet", "d_model": 16, "n_heads": 2, "enc_layers": 3, "dec_layers": 2,
                                  "d_ff": 32, "dropout": 0.0, "comet": comet}, "model")
    torch.manual_seed(0)
    models = [build_model(cfg, 20, 20, 0) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    gen = torch.Generator().manual_seed(3)
    src, mask = random_batch([7, 4, 9, 3], 20, gen)
    tgt, _ = random_batch([6, 8, 3, 5], 20, gen)
    real_shared = transformer._shared_padding

    def run(i: int, train: bool) -> tuple[torch.Tensor, dict]:
        monkeypatch.setattr(transformer, "_shared_padding", real_shared if i == 0 else lambda *a, **k: None)
        model = models[i].train(train)
        with torch.set_grad_enabled(train), _Ops() as seen:
            logits = model(src, mask, tgt)
        return logits, seen.count

    ops = {}
    for train in (False, True, False, True):  # eval (bucket statistics, if any, unseen), train, eval, train
        (got, ops[train, "shared"]), (want, ops[train, "own"]) = run(0, train), run(1, train)
        assert torch.equal(got, want), train
        if train:
            got.square().mean().backward(), want.square().mean().backward()
    for (k, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert a.grad is not None and torch.equal(a.grad, b.grad), k
    for (k, a), (_, b) in zip(state_buffers(models[0]), state_buffers(models[1])):
        assert torch.equal(a, b), k
    # training: the padding statistics (one clamp each) derived once a stack where each unit derived them
    stacks, units = (2, 5) if comet.get("decoder") else (1, 3)
    for op in ("clamp", "bitwise_not"):
        assert ops[True, "own"][op] - ops[True, "shared"][op] == units - stacks, op
    # evaluation with the encoder's per-length statistics: the real lengths, once a forward not once a unit
    saved = 3 - 1 if comet.get("bn_length_bounds") else 0
    assert ops[False, "own"]["bitwise_not"] - ops[False, "shared"]["bitwise_not"] == saved


@pytest.mark.parametrize("case", ["comet", "comet_bn_length", "comet_ffn2", "comet_4layer", "comet_temporal"])
def test_gpu_training_path_cuts_equal_the_reference_bit_for_bit(case, monkeypatch):
    """The operator cuts of the unpadded GPU path (F.conv1d): batch norm as torch.native_batch_norm
    (F.batch_norm's dispatch added an empty reserve tensor), and under autocast a unit's convolution
    and linear parameters cast in one cast of their concatenation (cast_params_once; False: a cast
    each). Against the reference (F.batch_norm, cast_params_once off), a whole model's logits, every
    parameter's gradient and every buffer are equal bit for bit, float32 and bf16 autocast, train
    and eval mode; and in training the cuts dispatch fewer operators: an ``empty`` fewer a norm,
    and under bf16 2 casts forward and 2 backward a unit where there was one each a parameter."""
    models = [test_models.make(case, seed=3) for _ in range(2)]
    for m in (m for model in models for m in model.modules()):
        if isinstance(m, GatedConv):
            m.use_conv1d = True
    for m in models[1].modules():
        if isinstance(m, ConvUnit):
            m.cast_params_once = False
    reference_bn = lambda x, w, b, mean, var, training, momentum, eps: (  # noqa: E731
        torch.nn.functional.batch_norm(x, mean, var, w, b, training, momentum, eps),)
    gen = torch.Generator().manual_seed(4)
    src, _ = random_batch([6, 6, 6], test_models.V_SRC, gen)  # one source length: unpadded, the mask None
    tgt, _ = random_batch([5, 7, 3], test_models.V_TGT, gen)
    units = [m for m in models[0].encoder.modules() if isinstance(m, ConvUnit)]
    encoder_norms = sum(isinstance(m, MaskedBatchNorm) for m in models[0].encoder.modules())
    for precision in ("fp32", "bf16"):
        for training in (True, False):
            results, ops = [], []
            for i, model in enumerate(models):
                model.train(training)
                with pytest.MonkeyPatch.context() as mp:
                    if i == 1:
                        mp.setattr(torch, "native_batch_norm", reference_bn)
                    torch.manual_seed(9)  # the same dropout masks
                    with _Ops(views=False) as seen:
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                            logits = model(src, None, tgt)
                        logits.float().logsumexp(-1).mean().backward()
                results.append((logits, {k: p.grad for k, p in model.named_parameters()}))
                ops.append(collections.Counter(seen.count))
                model.zero_grad(set_to_none=True)
            (y0, g0), (y1, g1) = results
            where = (precision, training)
            assert torch.equal(y0, y1), where
            assert g0.keys() == g1.keys() and all(g is not None for g in g0.values()), where
            for k in g0:
                assert torch.equal(g0[k], g1[k]), (where, k)
            for (k, a), (_, b) in zip(state_buffers(models[0]), state_buffers(models[1])):
                assert torch.equal(a, b), (where, k)
            if not training:  # evaluation: no batch statistics, no cut
                assert ops[0] == ops[1], where
                continue
            fast, ref = ops
            cut = ref["empty"] - fast["empty"]
            assert cut >= encoder_norms > 0, where  # the decoder's norms too, where it has them
            if precision == "bf16":  # each encoder unit: a cast of its parameters' concatenation each way, not one a parameter
                params = sum(2 * len(u.convs.convs) + 2 * (u.kind == "conv") for u in units)
                assert ref["_to_copy"] - fast["_to_copy"] == 2 * params - 2 * len(units), where
                assert fast["cat"] - ref["cat"] == 2 * len(units), where  # the concatenation and its gradients'
                cut += 2 * params - 4 * len(units)
            assert sum(ref.values()) - sum(fast.values()) == cut, where  # nothing else changed
