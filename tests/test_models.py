"""Properties every registered architecture (and every COMET variant) must have (DESIGN.md rule 10).

Each case is a small model built from a ModelConfig through the registry, so adding an
architecture to ``cometnmt.models.REGISTRY`` plus a line in ``CASES`` puts it under every test.
An architecture of one's own, outside the package, is put under every test by naming the module
that registers it: ``COMETNMT_PLUGINS=mine.py python -m pytest tests/test_models.py -k mine``
(a case per architecture it registers, built with the shared sizes of ``SMALL``).
"""

from __future__ import annotations

import pytest
import torch

from cometnmt.config import ModelConfig, from_dict
from cometnmt.models import BUILTIN_ARCHS, REGISTRY, build_model
from conftest import load_plugins_as_cases, state_buffers

PAD, BOS, EOS = 0, 2, 3
V_SRC, V_TGT = 23, 19

SMALL = {"d_model": 32, "n_heads": 4, "enc_layers": 2, "dec_layers": 2, "d_ff": 64, "dropout": 0.1}

CASES = {
    "transformer": {"arch": "transformer"},
    "comet": {"arch": "comet"},
    "comet_temporal": {"arch": "comet", "comet": {"decoder": "temporal_conv"}},
    "comet_temporal_no_decoder_bn": {"arch": "comet", "comet": {"decoder": "temporal_conv", "decoder_batch_norm": False}},
    "comet_ffn1": {"arch": "comet", "comet": {"unit": "ffn1", "ffn1_hidden": 48}},
    "comet_ffn2": {"arch": "comet", "comet": {"unit": "ffn2", "ffn2_hidden": 48}},
    "comet_4layer": {"arch": "comet", "comet": {"features": [64, 32, 16, 8], "dilations": [1, 2, 3, 4]}},
    "comet_bn_length": {"arch": "comet", "comet": {"bn_length_bounds": [4, 8]}},
    "comet_temporal_bn_length": {"arch": "comet", "comet": {"decoder": "temporal_conv", "decoder_bn_length_bounds": [4, 8]}},
    "convs2s": {"arch": "convs2s", "convs2s": {"embed_dim": 16, "enc_layers": [[32, 3, 2]], "dec_layers": [[32, 3, 2]], "out_embed_dim": 24}},
    "convs2s_mixed": {"arch": "convs2s", "convs2s": {"embed_dim": 16, "enc_layers": [[24, 2], [32, 5], [32, 1]], "dec_layers": [[24, 2], [32, 4], [32, 1]], "out_embed_dim": 16}},
    "rnn_gru_additive": {"arch": "rnn", "rnn": {"cell": "gru", "embed_dim": 16, "hidden_size": 32, "attention": "additive"}},
    "rnn_lstm_general": {"arch": "rnn", "rnn": {"cell": "lstm", "embed_dim": 16, "hidden_size": 32, "enc_layers": 2, "dec_layers": 2, "attention": "general"}},
    "rnn_gru_dot": {"arch": "rnn", "rnn": {"cell": "gru", "embed_dim": 16, "hidden_size": 32, "dec_layers": 2, "attention": "dot"}},
    "rnn_lstm_scaled_dot_no_feed": {"arch": "rnn", "rnn": {"cell": "lstm", "embed_dim": 16, "hidden_size": 32, "attention": "scaled_dot", "input_feeding": False, "bridge": False}},
    "transformer_pp": {"arch": "transformer_pp", "transformer_pp": {"kernel_sizes": [3, 5], "dilations": [1, 2], "tasks": []}},
    "transformer_pp_all_conv": {"arch": "transformer_pp", "transformer_pp": {"kernel_sizes": [5, 3], "dilations": [1, 1], "conv_heads": 4, "tasks": []}},
    "transformer_tied": {"arch": "transformer", "tie_embeddings": True},
    "comet_tied": {"arch": "comet", "tie_embeddings": True},
    "transformer_pp_tied": {"arch": "transformer_pp", "tie_embeddings": True, "transformer_pp": {"kernel_sizes": [3, 5], "dilations": [1, 2], "tasks": []}},
}
load_plugins_as_cases()  # the architectures $COMETNMT_PLUGINS registers, each a case of its own
CASES.update({arch: {"arch": arch} for arch in REGISTRY if arch not in BUILTIN_ARCHS and arch not in CASES})


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = from_dict(ModelConfig, {**SMALL, **CASES[name]}, "model")
    return build_model(cfg, V_SRC, V_TGT, PAD)


def random_batch(lengths: list[int], vocab: int, generator: torch.Generator):
    """Right-padded token ids B,L (no specials) and pad mask."""
    L = max(lengths)
    ids = torch.full((len(lengths), L), PAD, dtype=torch.long)  # B,L
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(4, vocab, (n,), generator=generator)
    return ids, ids.eq(PAD)


def warm_batch_norm(model, gen):
    """Train-mode forward passes so batch-norm running statistics are not the identity."""
    model.train()
    # mean source lengths 6.7, 2.3 and 11: with per-length statistics (bounds [4, 8]) every bucket
    # gets its own
    for src_lengths, tgt_lengths in [([7, 4, 9], [6, 8, 3]), ([2, 3, 2], [3, 2, 4]), ([12, 10, 11], [9, 12, 10])]:
        src, mask = random_batch(src_lengths, V_SRC, gen)
        tgt, _ = random_batch(tgt_lengths, V_TGT, gen)
        model(src, mask, tgt)
    model.eval()


@pytest.fixture(params=sorted(CASES))
def name(request):
    return request.param


def test_output_shapes(name):
    model = make(name).eval()
    gen = torch.Generator().manual_seed(1)
    src, mask = random_batch([5, 3], V_SRC, gen)
    tgt, _ = random_batch([4, 6], V_TGT, gen)
    logits = model(src, mask, tgt)
    assert logits.shape == (2, 6, V_TGT)
    assert torch.isfinite(logits).all()


def test_padding_invariance(name):
    """A sentence translated alone or inside a padded batch gives the same encoding and logits."""
    model = make(name)
    gen = torch.Generator().manual_seed(2)
    warm_batch_norm(model, gen)
    src, mask = random_batch([6, 11, 3], V_SRC, gen)
    tgt, _ = random_batch([5, 9, 2], V_TGT, gen)
    with torch.no_grad():
        mem = model.encode(src, mask)
        batch_logits = model.decode(tgt, mem)
        for i, (n_src, n_tgt) in enumerate([(6, 5), (11, 9), (3, 2)]):
            alone = model.encode(src[i : i + 1, :n_src], mask[i : i + 1, :n_src])
            torch.testing.assert_close(alone["out"][0], mem["out"][i, :n_src], atol=1e-5, rtol=1e-5)
            logits = model.decode(tgt[i : i + 1, :n_tgt], alone)
            torch.testing.assert_close(logits[0], batch_logits[i, :n_tgt], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["transformer", "comet", "transformer_pp"])
def test_the_attention_mask_is_built_once_a_forward_with_the_same_outputs(name, monkeypatch):
    """Every encoder self-attention and decoder cross-attention built its own key_mask of the same
    pad mask (an operator each, 2 x layers a forward); encode and decode now build it once and
    pass it down. The outputs are those of masks built in each layer, as before, bit for bit."""
    import cometnmt.models.transformer as transformer
    import cometnmt.models.transformer_pp as transformer_pp
    import cometnmt.modules.attention as attention

    model = make(name)
    gen = torch.Generator().manual_seed(5)
    warm_batch_norm(model, gen)
    src, mask = random_batch([6, 11, 3], V_SRC, gen)
    tgt, _ = random_batch([5, 9, 2], V_TGT, gen)
    calls, key_mask = [], attention.key_mask

    def counted(pad_mask):
        calls.append(pad_mask)
        return key_mask(pad_mask)

    for module in (attention, transformer, transformer_pp):
        monkeypatch.setattr(module, "key_mask", counted)
    with torch.no_grad():
        mem = model.encode(src, mask)
        logits = model.decode(tgt, mem)
    built = [c for c in calls if c is not None]  # key_mask(None) (causal self-attention) is None, no operator
    assert len(built) == 2 and all(c is mask for c in built)  # once in encode, once in decode (was 2 + 2 with layers)
    monkeypatch.undo()
    with torch.no_grad():  # each layer building its own mask (and everything else of its ForwardContext), as before
        x = model.src_embed(src)  # B,S,D
        for unit in model.encoder:
            x = unit(x, model.context(model.encoder, x, mask, mask))  # B,S,D
        assert torch.equal(x, mem["out"])
        y = model.tgt_embed(tgt)  # B,T,D
        tgt_mask = tgt.eq(PAD)  # B,T
        for unit in model.decoder:
            y = unit(y, x, model.context(model.decoder, y, tgt_mask, mask))  # B,T,D
        assert torch.equal(model.out_proj(y), logits)


@pytest.mark.parametrize("name", ["transformer", "comet", "comet_temporal_bn_length", "transformer_pp"])
def test_every_unit_of_a_stack_reads_one_forward_context(name):
    """What a forward derives once for a stack (the attention mask, COMET's padding statistics, the
    source lengths) reaches each unit as one ForwardContext, built once a forward and read by all
    the stack's units, where each was a separate argument threaded through every unit's call."""
    from cometnmt.models.transformer import ForwardContext

    model = make(name).train()
    gen = torch.Generator().manual_seed(4)
    src, mask = random_batch([6, 11, 3], V_SRC, gen)
    tgt, tgt_mask = random_batch([5, 9, 2], V_TGT, gen)
    seen = {"encoder": [], "decoder": []}
    hooks = [unit.register_forward_pre_hook(lambda m, args, stack=stack: seen[stack].append(args[-1]))
             for stack in seen for unit in getattr(model, stack)]
    try:
        model(src, mask, tgt)
    finally:
        for hook in hooks:
            hook.remove()
    for stack, own_mask in (("encoder", mask), ("decoder", tgt_mask)):
        ctx = seen[stack][0]
        assert isinstance(ctx, ForwardContext) and len(seen[stack]) == len(getattr(model, stack)), stack
        assert all(c is ctx for c in seen[stack]), stack  # once a forward, not once a unit
        assert torch.equal(ctx.pad_mask, own_mask) and torch.equal(ctx.source_mask, ~mask[:, None, None, :]), stack
    comet = name.startswith("comet")
    assert (seen["encoder"][0].padding is not None) == comet  # COMET's padding statistics; the FFN needs none
    assert (seen["decoder"][0].src_lengths is not None) == (name == "comet_temporal_bn_length")


def test_train_mode_padding_does_not_change_real_positions(name):
    """In training mode too (batch statistics!), adding a padded column changes nothing real."""
    model = make(name).train()
    gen = torch.Generator().manual_seed(3)
    src, mask = random_batch([6, 4], V_SRC, gen)
    tgt, _ = random_batch([5, 3], V_TGT, gen)
    wide_src = torch.cat([src, torch.full((2, 5), PAD)], dim=1)
    wide_tgt = torch.cat([tgt, torch.full((2, 4), PAD)], dim=1)
    torch.manual_seed(0)
    out = model(src, mask, tgt)
    torch.manual_seed(0)
    # Dropout masks depend on tensor sizes, so compare with dropout off but batch norm in training mode.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    out = model(src, mask, tgt)
    wide = model(wide_src, wide_src.eq(PAD), wide_tgt)
    real = ~tgt.eq(PAD)
    torch.testing.assert_close(wide[:, : tgt.size(1)][real], out[real], atol=1e-5, rtol=1e-5)


def test_decoder_is_causal(name):
    """Changing target token t changes no logits before t."""
    model = make(name)
    gen = torch.Generator().manual_seed(4)
    warm_batch_norm(model, gen)
    src, mask = random_batch([7, 5], V_SRC, gen)
    tgt, _ = random_batch([9, 9], V_TGT, gen)
    with torch.no_grad():
        mem = model.encode(src, mask)
        base = model.decode(tgt, mem)
        for t in (1, 4, 8):
            changed = tgt.clone()
            changed[:, t] = (changed[:, t] + 1 - 4) % (V_TGT - 4) + 4
            out = model.decode(changed, mem)
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-5, rtol=1e-5)
            assert not torch.allclose(out[:, t:], base[:, t:])


def test_incremental_step_equals_full_decode(name):
    model = make(name)
    gen = torch.Generator().manual_seed(5)
    warm_batch_norm(model, gen)
    src, mask = random_batch([7, 3, 5], V_SRC, gen)
    tgt, _ = random_batch([8, 8, 8], V_TGT, gen)
    tgt[:, 0] = BOS
    with torch.no_grad():
        mem = model.encode(src, mask)
        full = model.decode(tgt, mem)  # B,T,V
        state = model.init_state(mem)
        for t in range(tgt.size(1)):
            logits, state = model.step(tgt[:, t], state)
            torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)


def test_reorder_selects_rows(name):
    """reorder(state, index) makes row i of the new state continue sentence index[i]."""
    model = make(name).eval()
    gen = torch.Generator().manual_seed(6)
    src, mask = random_batch([4, 6], V_SRC, gen)
    with torch.no_grad():
        mem = model.encode(src, mask)
        state = model.init_state(mem)
        first = torch.tensor([BOS, BOS])
        _, state = model.step(first, state)
        nxt = torch.tensor([5, 7])
        ref, _ = model.step(nxt, state)
        index = torch.tensor([1, 1, 0])
        swapped = model.reorder(state, index)
        got, _ = model.step(nxt.index_select(0, index), swapped)
    torch.testing.assert_close(got, ref.index_select(0, index), atol=1e-5, rtol=1e-5)


def test_loss_ignores_padding(name):
    """Cross-entropy with ignore_index=PAD is unchanged by extra padded columns."""
    model = make(name)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    gen = torch.Generator().manual_seed(7)
    src, mask = random_batch([5, 4], V_SRC, gen)
    tgt, _ = random_batch([4, 2], V_TGT, gen)
    gold, _ = random_batch([4, 2], V_TGT, gen)
    gold = gold.masked_fill(tgt.eq(PAD), PAD)

    def loss(s, t, g):
        logits = model(s, s.eq(PAD), t)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), g.flatten(), ignore_index=PAD, reduction="sum")

    pad2 = lambda x: torch.cat([x, torch.full((2, 3), PAD)], dim=1)
    torch.testing.assert_close(loss(src, tgt, gold), loss(pad2(src), pad2(tgt), pad2(gold)), atol=1e-4, rtol=1e-5)


def test_unpadded_source_as_none_computes_the_same(name):
    """Models that declare ``unpadded_source_as_none`` get ``src_pad_mask=None`` from the trainer for a
    batch without source padding; in training mode (dropout on, the same masks drawn) they must
    compute what an all-False mask gives: logits, gradients and batch-norm running statistics."""
    model = make(name, seed=2)
    if not model.unpadded_source_as_none:
        pytest.skip(f"{name} always gets the mask")
    twin = make(name, seed=2)
    gen = torch.Generator().manual_seed(4)
    src, mask = random_batch([6, 6, 6], V_SRC, gen)  # one source length: no padding
    tgt, _ = random_batch([5, 7, 3], V_TGT, gen)
    assert not mask.any()
    outs = []
    for m, src_mask in ((model, mask), (twin, None)):
        m.train()
        torch.manual_seed(9)
        logits = m(src, src_mask, tgt)
        logits.float().logsumexp(-1).mean().backward()
        outs.append(logits)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    grads = [dict((k, p.grad) for k, p in m.named_parameters() if p.grad is not None) for m in (model, twin)]
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-4, msg=k)
    for (k, a), (_, b) in zip(state_buffers(model), state_buffers(twin)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=k)


@pytest.mark.parametrize("name", ["transformer", "comet"])
def test_attention_dropout_acts_in_training_only(name):
    """model.attention_dropout drops attention probabilities in training (outputs change with the
    dropout draw) and leaves evaluation exactly as the model without it (same weights)."""
    torch.manual_seed(0)
    base = {**SMALL, "dropout": 0.0, **CASES[name]}
    plain = build_model(from_dict(ModelConfig, base, "model"), V_SRC, V_TGT, PAD)
    dropped = build_model(from_dict(ModelConfig, {**base, "attention_dropout": 0.5}, "model"), V_SRC, V_TGT, PAD)
    dropped.load_state_dict(plain.state_dict())
    attns = [m for m in dropped.modules() if type(m).__name__ == "MultiHeadAttention"]
    assert len(attns) == 2 * 3 and all(a.attn_dropout.p == 0.5 for a in attns)  # 2 encoder + 2x2 decoder attentions
    gen = torch.Generator().manual_seed(1)
    src, mask = random_batch([7, 4, 9], V_SRC, gen)
    tgt, _ = random_batch([6, 8, 3], V_TGT, gen)
    for m in (plain, dropped):
        m.eval()
    with torch.no_grad():
        assert torch.equal(plain(src, mask, tgt), dropped(src, mask, tgt))
        dropped.train()
        plain.train()
        torch.manual_seed(5)
        a = dropped(src, mask, tgt)
        torch.manual_seed(6)
        b = dropped(src, mask, tgt)
        torch.manual_seed(5)
        c = plain(src, mask, tgt)
    assert not torch.allclose(a, b)  # a different draw, different outputs
    assert not torch.allclose(a, c)  # and not the model without attention dropout


def test_cross_attention_weights(name):
    """``cross_attention``: per decoder layer, B,H,T,S weights whose rows sum to 1 over the real
    source positions and are 0 at padding; a sentence's weights are the same alone as in a padded
    batch; keeping them (the weights written out where SDPA would fuse them) leaves the logits as
    they are; afterwards the modules keep nothing."""
    model = make(name)
    gen = torch.Generator().manual_seed(5)
    warm_batch_norm(model, gen)
    src, mask = random_batch([6, 3, 8], V_SRC, gen)
    tgt, _ = random_batch([5, 7, 4], V_TGT, gen)
    layers = model.cross_attention(src, mask, tgt)
    modules = model.cross_attention_modules()
    assert len(layers) == len(modules) >= 1
    for w in layers:
        assert w.shape[0] == 3 and w.shape[2:] == (7, 8) and w.dtype == torch.float32
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:3]))
        assert w.masked_select(mask[:, None, None, :]).abs().max() == 0  # padded sources get nothing
    alone = model.cross_attention(src[1:2, :3], mask[1:2, :3], tgt[1:2])
    for w_batch, w_alone in zip(layers, alone):
        torch.testing.assert_close(w_alone[0], w_batch[1, :, :, :3], rtol=1e-5, atol=1e-6)
    assert all("keep_weights" not in vars(m) and not m.keep_weights for m in modules)  # back to keeping nothing
    plain = model(src, mask, tgt)
    for m in modules:
        m.keep_weights, m.kept = True, []
    try:
        kept = model(src, mask, tgt)
    finally:
        for m in modules:
            del m.keep_weights, m.kept
    torch.testing.assert_close(kept, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["transformer", "comet", "transformer_pp"])
def test_tied_embeddings_share_one_matrix(name):
    """model.tie_embeddings: the output projection's weight is the target embedding matrix (one
    parameter, counted once), and its gradient sums the two uses."""
    untied, tied = make(name), make(f"{name}_tied")
    assert tied.out_proj.weight is tied.tgt_embed.embed.weight
    assert untied.out_proj.weight is not untied.tgt_embed.embed.weight
    assert untied.num_parameters() - tied.num_parameters() == V_TGT * SMALL["d_model"]
    assert len(tied.state_dict()) == len(untied.state_dict())  # both keys saved, as PyTorch does

    gen = torch.Generator().manual_seed(1)
    src, mask = random_batch([5, 3], V_SRC, gen)
    tgt, _ = random_batch([4, 6], V_TGT, gen)
    tied.eval()
    tied(src, mask, tgt).logsumexp(-1).sum().backward()
    shared = tied.tgt_embed.embed.weight.grad.clone()
    tied.zero_grad()
    # the output side's gradient alone: the same logits through a detached copy of the matrix
    weight = tied.out_proj.weight.detach().clone().requires_grad_()
    hidden = {}
    handle = tied.out_proj.register_forward_hook(lambda m, inp, out: hidden.setdefault("x", inp[0].detach()))
    tied(src, mask, tgt)
    handle.remove()
    torch.nn.functional.linear(hidden["x"], weight, tied.out_proj.bias.detach()).logsumexp(-1).sum().backward()
    rows = set(tgt[tgt != PAD].tolist())
    unused = [r for r in range(V_TGT) if r not in rows]  # rows no input token looks up: output gradient only
    torch.testing.assert_close(shared[unused], weight.grad[unused])
    assert not torch.allclose(shared[sorted(rows)], weight.grad[sorted(rows)])  # the looked-up rows get both


def test_convs2s_scales_the_encoder_gradient_by_one_over_twice_the_attention_layers():
    """Gehring et al. section 3.4 (fairseq's GradMultiply): gradients reaching the encoder through
    the decoder's m attention layers are scaled by 1/(2m); the decoder's are not. convs2s_mixed has
    m = 3, so its encoder convolutions and projections get 1/6 of the unscaled gradient. The source
    embeddings also reach the attention values directly, unscaled, so they are left out."""
    gen = torch.Generator().manual_seed(3)
    src, mask = random_batch([6, 4, 5], V_SRC, gen)
    tgt, _ = random_batch([5, 6, 3], V_TGT, gen)
    grads = {}
    for scale in (True, False):
        torch.manual_seed(0)
        case = {**CASES["convs2s_mixed"], "convs2s": {**CASES["convs2s_mixed"]["convs2s"], "scale_encoder_grad": scale}}
        model = build_model(from_dict(ModelConfig, {**SMALL, **case}, "model"), V_SRC, V_TGT, PAD).double().eval()
        model(src, mask, tgt).logsumexp(-1).sum().backward()
        grads[scale] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys()
    encoder = [n for n in grads[True] if n.startswith(("enc_in", "encoder.", "enc_out"))]
    decoder = [n for n in grads[True] if n.startswith(("tgt_embed", "dec_in", "decoder.", "dec_out", "out_proj"))]
    assert len(encoder) >= 6 and len(decoder) >= 6
    for n in encoder:
        assert torch.allclose(grads[True][n], grads[False][n] / 6, rtol=1e-9, atol=1e-12), n
        assert grads[False][n].abs().max() > 1e-6, n  # a gradient to scale
    for n in decoder:
        assert torch.allclose(grads[True][n], grads[False][n], rtol=1e-9, atol=1e-12), n


def test_a_wrongly_registered_builder_is_a_config_error_naming_it(monkeypatch):
    """A researcher's builder added to REGISTRY with another signature, returning something that
    is not a Seq2Seq, or a Seq2Seq lacking a protocol method, was a TypeError, AttributeError
    ('... has no attribute position_limit') or NotImplementedError traceback from inside training,
    after the data had been read; now a ConfigError naming model.arch and the builder, and the
    signature is checked when the config loads."""
    from cometnmt.config import config_from_dict
    from cometnmt.errors import ConfigError
    from cometnmt.models import REGISTRY
    from cometnmt.models.base import Seq2Seq

    class NoStep(Seq2Seq):
        def encode(self, src, src_pad_mask):
            return {}

        def decode(self, tgt_in, memory):
            return tgt_in

        def init_state(self, memory):
            return {}

    def two_args(cfg, vocab_size):
        return REGISTRY["transformer"](cfg, vocab_size, vocab_size, PAD)

    monkeypatch.setitem(REGISTRY, "two_args", two_args)
    monkeypatch.setitem(REGISTRY, "plain_module", lambda cfg, s, t, p: torch.nn.Linear(2, 2))
    monkeypatch.setitem(REGISTRY, "no_step", lambda cfg, s, t, p: NoStep(p))
    monkeypatch.setitem(REGISTRY, "mine", REGISTRY["transformer"])
    with pytest.raises(ConfigError, match=r"^config key 'model\.arch': the builder registered as 'two_args' "
                                          r"\(.*two_args\(cfg, vocab_size\)\) cannot be called as builder\(model_cfg, "
                                          r"src_vocab_size, tgt_vocab_size, pad_id\)"):
        config_from_dict({"model": {"arch": "two_args"}})
    with pytest.raises(ConfigError, match=r"'two_args'.*cannot be called as builder"):
        build_model(from_dict(ModelConfig, {**SMALL, "arch": "two_args"}, "model"), V_SRC, V_TGT, PAD)
    with pytest.raises(ConfigError, match=r"'plain_module' \(.*\) returned a Linear, not a cometnmt.models.base.Seq2Seq"):
        build_model(from_dict(ModelConfig, {**SMALL, "arch": "plain_module"}, "model"), V_SRC, V_TGT, PAD)
    with pytest.raises(ConfigError, match=r"NoStep, built by the builder registered as 'no_step' .* does not define step "
                                          r"of the Seq2Seq protocol"):
        build_model(from_dict(ModelConfig, {**SMALL, "arch": "no_step"}, "model"), V_SRC, V_TGT, PAD)
    assert isinstance(build_model(from_dict(ModelConfig, {**SMALL, "arch": "mine"}, "model"), V_SRC, V_TGT, PAD), Seq2Seq)


def test_an_architecture_of_ones_own_is_put_under_every_property_by_cometnmt_plugins(tmp_path):
    """DESIGN.md rule 10's properties (padding invariance, causality, incremental == full, ...) and
    the copy task lived in CASES and ARCHS, which a researcher's architecture, registered outside
    the package, could join only by editing the tests. With $COMETNMT_PLUGINS naming the module
    that registers it, every property test and the copy task collect a case for it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    plugin = tmp_path / "my_arch.py"
    plugin.write_text("from cometnmt.models import REGISTRY\nREGISTRY['my_arch'] = REGISTRY['transformer']\n", encoding="utf-8")
    tests = Path(__file__).parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-k", "my_arch", "-p", "no:cacheprovider",
                           str(tests / "test_models.py"), str(tests / "test_arch_copy.py")],
                          env={**os.environ, "COMETNMT_PLUGINS": str(plugin)}, cwd=tests.parent, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for test in ("test_output_shapes", "test_padding_invariance", "test_train_mode_padding_does_not_change_real_positions",
                 "test_decoder_is_causal", "test_incremental_step_equals_full_decode", "test_reorder_selects_rows",
                 "test_loss_ignores_padding", "test_cross_attention_weights"):
        assert f"test_models.py::{test}[my_arch]" in proc.stdout, test
    assert "test_arch_copy.py::test_learns_to_copy[my_arch]" in proc.stdout


def test_a_builder_reading_shared_keys_its_uses_does_not_name_is_warned_of(monkeypatch, caplog):
    """register_architecture(..., uses=(...)) was trusted: a builder reading model.d_ff that its
    uses left out trained with a d_ff the loader never checked and train called unused. Building
    now records the shared keys and package sections the builder reads and warns of those uses
    does not name; docs/architectures.md's declaration for build_transformer is exact, and dataclasses.replace's
    reads of every field are not the builder's."""
    import dataclasses

    from cometnmt.config import ModelConfig, from_dict
    from cometnmt.models import REGISTRY, USES, build_model, register_architecture
    from cometnmt.models.base import Seq2Seq
    from cometnmt.models.transformer import build_transformer

    def build_wide(cfg, *sizes):  # reads model.d_model through replace, then the shared keys as build_transformer does
        return build_transformer(dataclasses.replace(cfg, d_ff=2 * cfg.d_model), *sizes)

    for table in (REGISTRY, USES):
        monkeypatch.setitem(table, "mine", None)  # removed again after the test
    readme = ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "dropout", "attention_dropout", "max_positions")
    cases = ((build_transformer, readme, []), (build_transformer, tuple(k for k in readme if k != "d_ff"), ["model.d_ff"]),
             (build_wide, readme, []), (build_wide, ("n_heads", "enc_layers"), ["model.d_model", "model.dec_layers",
                                                                                "model.d_ff", "model.dropout", "model.attention_dropout",
                                                                                "model.max_positions"]))
    for builder, uses, undeclared in cases:
        register_architecture("mine", builder, uses=uses)
        caplog.clear()
        with caplog.at_level("WARNING", logger="cometnmt.models"):
            model = build_model(from_dict(ModelConfig, {**SMALL, "arch": "mine"}, "model"), V_SRC, V_TGT, PAD)
        said = [r.getMessage() for r in caplog.records]
        if undeclared:
            assert said == [f"model.arch 'mine': its builder {builder.__module__}.{builder.__qualname__} read "
                            f"{', '.join(undeclared)}, which register_architecture('mine', ..., uses=...) does not name: the "
                            f"config loader does not check them and train calls them unused; add them to uses"], said
        else:
            assert said == [], said
        assert isinstance(model, Seq2Seq)
    assert "__getattribute__" not in vars(ModelConfig)  # the recorder is gone once built


def test_a_plugin_that_calls_sys_exit_is_the_broken_plugin_line(tmp_path, monkeypatch, capsys):
    """A $COMETNMT_PLUGINS file calling sys.exit() as it imports ended the CLI with that status and
    no word of which plugin (load_plugins caught Exception, not SystemExit). It is now the broken
    plugin's line, exit 2; Ctrl-C in a plugin (KeyboardInterrupt) is still an interrupt."""
    from cometnmt.cli import main
    from cometnmt.errors import ConfigError
    from cometnmt.models import load_plugins

    exits = tmp_path / "exits_arch.py"
    exits.write_text("import sys\n\nsys.exit(3)\n", encoding="utf-8")
    monkeypatch.setenv("COMETNMT_PLUGINS", str(exits))
    line = f"$COMETNMT_PLUGINS: cannot import '{exits}' ({exits}:3): SystemExit: 3"
    with pytest.raises(ConfigError) as caught:
        load_plugins()
    assert str(caught.value) == line
    assert main(["evaluate", "--hyp", str(exits), "--ref", str(exits)]) == 2
    assert capsys.readouterr().err.endswith(f"cometnmt: error: {line}\n")
    interrupted = tmp_path / "interrupted_arch.py"
    interrupted.write_text("raise KeyboardInterrupt\n", encoding="utf-8")
    monkeypatch.setenv("COMETNMT_PLUGINS", str(interrupted))
    with pytest.raises(KeyboardInterrupt):
        load_plugins()


def test_a_plugin_that_does_not_import_is_one_line_in_collection_and_in_the_cli(tmp_path):
    """A $COMETNMT_PLUGINS file that raises on import broke the collection of test_models.py and
    test_arch_copy.py with two tracebacks each (through importlib's frozen frames, then "The above
    exception was the direct cause of ..."). Each module's collection error is now the one line
    naming the file, its failing line and the exception. The CLI: a command stops with that line
    and exit 2; --help, which imports no plugin, still shows the help (how to learn about
    $COMETNMT_PLUGINS while one is broken)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    broken = tmp_path / "broken_arch.py"
    broken.write_text("import os\n\nraise RuntimeError('boom')\n", encoding="utf-8")
    tests = Path(__file__).parent
    env = {**os.environ, "COMETNMT_PLUGINS": str(broken)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(tests / "test_models.py"), str(tests / "test_arch_copy.py")],
                          env=env, cwd=tests.parent, capture_output=True, text=True, timeout=300)
    line = f"$COMETNMT_PLUGINS: cannot import '{broken}' ({broken}:3): RuntimeError: boom"
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count(f"\n{line} (its architectures are cases of this module") == 2, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout and "direct cause" not in proc.stdout and "importlib" not in proc.stdout, proc.stdout[-3000:]
    for args, code in ((["--help"], 0), (["evaluate", "--hyp", str(broken), "--ref", str(broken)], 2)):
        proc = subprocess.run([sys.executable, "-m", "cometnmt", *args], env=env, cwd=tests.parent, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == code, (args, proc.stderr[-2000:])
        assert proc.stderr == ("" if code == 0 else f"cometnmt: error: {line}\n"), (args, proc.stderr[-2000:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_sixteen_bit_attention_on_the_cpu_trains_in_float32_where_its_kernel_is_slow(monkeypatch, dtype, dropout_p):
    """modules.attention.sdpa: 16-bit inputs that need gradients, without dropout, go to SDPA cast to
    float32 (PyTorch's CPU 16-bit flash-attention backward without dropout is ~10x slower); the
    output keeps the inputs' dtype and equals the 16-bit call's to its rounding, gradients too.
    With dropout, or without gradients (decoding), SDPA gets the 16-bit inputs as they are."""
    import torch.nn.functional as F

    from cometnmt.modules import attention

    seen = []
    real = F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        seen.append(q.dtype)
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", recording)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g).to(dtype).requires_grad_() for _ in range(3))
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    out = attention.sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=False)
    assert out.dtype == dtype and seen == [torch.float32 if dropout_p == 0.0 else dtype]
    with torch.no_grad():
        attention.sdpa(q, k, v, attn_mask=mask)
    assert seen[-1] == dtype  # decoding: as it was
    if dropout_p == 0.0:
        out.float().sum().backward()
        want = [t.detach().float().requires_grad_() for t in (q, k, v)]
        real(*want, attn_mask=mask).sum().backward()
        tol = dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out.float(), real(*(w.detach() for w in want), attn_mask=mask), **tol)
        for got, ref in zip((q, k, v), want):
            torch.testing.assert_close(got.grad.float(), ref.grad, **tol)
