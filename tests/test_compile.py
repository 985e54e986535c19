"""train.compile: the trainer's torch.compile path, its configured mode, and its eager fallback."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from cometnmt.config import load_config
from cometnmt.errors import ConfigError
from cometnmt.data.vocab import PAD
from cometnmt.models import build_model
from cometnmt.training import run as run_module
from cometnmt.training.checkpoint import load_checkpoint

from conftest import REPO, tiny_train_cfg


def tiny_cfg(save_dir, data_dir, *overrides):
    """Tiny COMET with per-length batch norm (two length buckets)."""
    return tiny_train_cfg(save_dir, data_dir, "model.arch=comet", "model.comet.bn_length_bounds=[8,12]", *overrides)


def final_state(save_dir) -> dict:
    return load_checkpoint(save_dir / "last.pt")["model"]


def test_compile_mode_is_checked():
    with pytest.raises(ConfigError, match="train.compile_mode.*needs train.compile: true"):
        load_config(REPO / "configs" / "tiny.yaml", ["train.compile_mode=reduce-overhead"])
    with pytest.raises(ConfigError, match="train.compile_mode"):
        load_config(REPO / "configs" / "tiny.yaml", ["train.compile=true", "train.compile_mode=fast"])
    assert load_config(REPO / "configs" / "tiny.yaml", ["train.compile=true", "train.compile_mode=reduce-overhead"]).train.compile


@pytest.mark.parametrize("mode, expected", [("default", None), ("reduce-overhead", "reduce-overhead")])
def test_trainer_compiles_with_the_configured_mode(tmp_path, data_dir, monkeypatch, mode, expected):
    seen = []

    def fake_compile(model, **kwargs):
        seen.append(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    run_module.train(tiny_cfg(tmp_path, data_dir, "train.max_steps=1", "train.compile=true", f"train.compile_mode={mode}"))
    assert seen == [{"mode": expected}]


def test_a_compile_failure_redoes_the_step_eagerly_from_the_same_state(tmp_path, data_dir, monkeypatch, caplog):
    """torch.compile fails at its first call, after the forward may already have updated batch-norm
    statistics and drawn dropout masks. The trainer restores both and redoes the step eagerly, so
    the run ends exactly where an eager run does."""
    steps = ["train.max_steps=3"]
    run_module.train(tiny_cfg(tmp_path / "eager", data_dir, *steps))

    class FailsAfterForward(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.calls = model, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            self.model(*args, **kwargs)  # running statistics updated, RNG advanced
            raise RuntimeError("backend compiler failed\nmore detail")

    wrappers = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: wrappers.append(FailsAfterForward(model)) or wrappers[-1])
    with caplog.at_level(logging.WARNING):
        run_module.train(tiny_cfg(tmp_path / "fallback", data_dir, *steps, "train.compile=true"))
    assert wrappers[0].calls == 1  # tried once, then eager for good
    assert "torch.compile failed at step 1 (RuntimeError: backend compiler failed); training eagerly" in caplog.text
    eager, fallback = final_state(tmp_path / "eager"), final_state(tmp_path / "fallback")
    assert any("running_mean" in k for k in eager)
    for key, value in eager.items():
        assert torch.equal(value, fallback[key]), key


@pytest.mark.parametrize("pairs, padded, decoder", [(300, True, False), (3000, False, False), (300, True, True)])
def test_compiled_comet_computes_the_eager_gradients(data_dir, monkeypatch, pairs, padded, decoder):
    """bench/check_compile.py with the real torch.compile (inductor, CPU) on COMET with per-length
    batch norm: loss, gradients and running statistics equal the eager trainer's, step after step
    at changing weights. 300 pairs give padded 600-token batches (the masked batch norm), 3,000
    give batches of one source length (F.batch_norm). There eager picks the statistics' bucket on
    the host and the compiled model on the device (a host choice would recompile per bucket), so the
    two choices are compared too. A bucket update that ran differently when compiled fails it
    (tried: its weight scaled by 0.9 under ``torch.compiler.is_compiling()``). ``decoder`` adds the
    temporal-convolution decoder with its batch norms' statistics per source length
    (``decoder_bn_length_bounds``), whose rows are picked by the source's length, not x's own
    (tried: the compiled decoder given the source lengths plus 4 fails it)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile
    from cometnmt.models.base import Seq2Seq

    masks = []
    original = Seq2Seq.training_source_mask
    monkeypatch.setattr(Seq2Seq, "training_source_mask", lambda self, batch: masks.append(original(self, batch)) or masks[-1])
    extra = ["model.comet.decoder=temporal_conv", "model.comet.decoder_bn_length_bounds=[9,13]"] if decoder else []
    cfg = tiny_cfg("unused", data_dir, f"data.max_train_pairs={pairs}", "train.accum_steps=1", "train.compile=true", *extra)
    result = check_compile.check(cfg, torch.device("cpu"), n_groups=1, passes=2, log=lambda line: None)
    assert result["ok"] and result["steps"] == 2, result
    assert masks and all((mask is not None) == padded for mask in masks)


def test_compiled_dropout_follows_the_micro_batch_seed(data_dir, monkeypatch):
    """bench/check_compile.py --dropout (run by scripts/gpu_session.sh check with CUDA graphs): with
    dropout on, a compiled step repeats exactly from the same weights and seed, and another seed
    changes it. On the CPU (inductor) here; it fails when the trainer stops seeding each
    micro-batch (tried: the second pass then drew other masks, gradients 0.67 apart)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile

    cfg = tiny_train_cfg("unused", data_dir, "train.compile=true", "model.dropout=0.3")  # the tiny Transformer
    result = check_compile.check_dropout(cfg, torch.device("cpu"), n_groups=1, passes=2, log=lambda line: None)
    assert result["ok"] and result["steps"] == 2, result


GRAPH_PRESETS = ["transformer", "comet", "comet_bn_length", "comet_temporal_conv", "comet_temporal_conv_decoder_bn_length",
                 "comet_temporal_conv_decoder_bn_length:conv1d", "comet_ffn1", "transformer_pp_en_de",
                 "convs2s", "comet_bn_length:conv1d"]  # each a different code path (the other Table 1 rows reuse these modules)


@pytest.mark.parametrize("preset", GRAPH_PRESETS)
def test_training_forward_compiles_to_one_graph(preset, monkeypatch):
    """No graph breaks in a training forward, padded or not: a break splits the compiled step into
    pieces run from Python with eager code between them, and CUDA graphs (compile_mode
    reduce-overhead) into several graphs. Three were found and removed: the CPU dropout's in-place
    ``random_`` (14 breaks in every model), ``bisect`` in per-length batch norm (compiled, it now picks
    its bucket on the device) and the CPU output layer's blocked ``out=`` products. Not the RNN:
    its packed sequences take the lengths on the host. ``:conv1d`` puts COMET's gated convolutions on
    their CUDA path (``F.conv1d`` in the B,C,L layout, batch norm as ``F.batch_norm``), the one a GPU
    compiles."""
    import torch._dynamo
    from cometnmt.models.comet import GatedConv

    preset, _, path = preset.partition(":")
    cfg = load_config(REPO / "configs" / "multi30k" / f"{preset}.yaml", ["model.d_model=64", "model.d_ff=64", "model.enc_layers=3", "model.dec_layers=1"])
    torch.manual_seed(0)
    V = 1100  # wide enough for the CPU's blocked output layer (VocabProjection), which must not break the graph
    from cometnmt.modules import output

    monkeypatch.setattr(output, "BLOCKED_ON", (torch.backends.cpu.get_cpu_capability(),))  # blocked on any CPU
    model = build_model(cfg.model, V, V, PAD).train()
    gated = [m for m in model.modules() if isinstance(m, GatedConv)]
    for m in gated:
        m.use_conv1d = path == "conv1d"
    assert gated or not path
    B, S, T = 8, 9, 10
    src, tgt = torch.randint(4, V, (B, S)), torch.randint(4, V, (B, T))
    extra = {}
    if cfg.model.arch == "transformer_pp" and cfg.model.transformer_pp.tasks:
        extra = {"tags": {"pos": torch.randint(0, 17, (B, S)), "ner": torch.randint(0, 37, (B, S))}}
    padded = torch.zeros(B, S, dtype=torch.bool)
    padded[::2, -3:] = True
    for mask in (padded, None if model.unpadded_source_as_none else torch.zeros(B, S, dtype=torch.bool)):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(src.masked_fill(padded, PAD) if mask is padded else src, mask, tgt, **extra)
        assert explained.graph_break_count == 0, [str(r.reason).splitlines()[0] for r in explained.break_reasons]


def test_accumulated_gradients_survive_cuda_graph_replays(data_dir, monkeypatch):
    """With CUDA graphs (compile_mode reduce-overhead) a backward replay returns each gradient in
    the graphs' memory pool, and the next replay overwrites it. Autograd installs the first
    micro-batch's gradient as ``.grad`` without a copy, so accumulating a second micro-batch went
    wrong (pytorch/pytorch#169545). Simulated on the CPU: each parameter's gradient is handed to
    autograd as a fresh view of one fixed buffer per parameter, rewritten by every backward, as the
    pool is by every replay. The trainer's accumulated gradients must still equal an eager
    trainer's, step after step; without ``_grads_out_of_graph_pool`` the second micro-batch's
    gradient is added to itself."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile
    from cometnmt.data.pipeline import read_split
    from cometnmt.training.run import training_examples

    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)  # "compiled": the trainer's graph path, eagerly
    cfg = tiny_cfg("unused", data_dir, "train.accum_steps=2", "train.compile=true", "train.compile_mode=reduce-overhead")
    codec, data = training_examples(cfg, read_split(cfg.data, "train"))
    eager_cfg = copy.deepcopy(cfg)
    eager_cfg.train.compile, eager_cfg.train.compile_mode = False, "default"
    eager = check_compile.build(eager_cfg, codec, data, torch.device("cpu"))
    graphed = check_compile.build(cfg, codec, data, torch.device("cpu"))
    assert graphed._compiled and not graphed.cuda_graphs  # a CPU device: no graphs unless told
    graphed.cuda_graphs = True
    for param in graphed.model.parameters():
        pool = torch.empty_like(param)
        param.register_hook(lambda grad, pool=pool: pool.copy_(grad).view_as(pool))
    groups = eager.epoch_batches(0)[:6]
    for group in (groups[0:2], groups[2:4], groups[4:6]):
        n_tokens = sum(len(data.tgt_ids[i]) + 1 for idx in group for i in idx)
        eager.backward(group, n_tokens)
        graphed.backward(group, n_tokens)
        for (name, want), got in zip(eager.model.named_parameters(), graphed.model.parameters()):
            assert (want.grad is None) == (got.grad is None), name
            if want.grad is not None:
                torch.testing.assert_close(got.grad, want.grad, msg=name)
        eager.update()
        graphed.update()


def test_cuda_graph_shapes_are_counted_once_and_repeat_every_epoch(data_dir, monkeypatch, caplog):
    """With CUDA graphs the trainer counts the batch shapes it will record (one graph each) and
    silences torch's warning at every new shape past 8. The count is that of the collated tensors'
    shapes, and with the default bucket_width 1 epoch 2 has exactly epoch 1's shapes, so its graphs
    are replayed, not recorded again."""
    import torch._inductor.config as inductor_config
    from cometnmt.data.pipeline import Examples, read_split
    from cometnmt.training.run import training_examples
    from cometnmt.training.trainer import Trainer

    monkeypatch.setattr(inductor_config.triton, "cudagraph_dynamic_shape_warn_limit", 8)
    cfg = tiny_cfg("unused", data_dir, "data.max_train_pairs=2000", "train.batch_tokens=400")
    codec, data = training_examples(cfg, read_split(cfg.data, "train"))
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD)
    trainer = Trainer(cfg, model, codec, data, Examples([], [], [], []), torch.device("cpu"))
    epochs = [trainer.epoch_batches(e) for e in range(3)]
    collated = {(b.src.shape, b.tgt_in.shape) for b in map(trainer.collate, epochs[0])}
    assert len(trainer.batch_shapes(epochs[0])) == len(collated) > 8
    assert trainer.batch_shapes(epochs[1]) == trainer.batch_shapes(epochs[2]) == trainer.batch_shapes(epochs[0])
    assert epochs[1] != epochs[0]  # other batches, in another order: the same shapes all the same
    with caplog.at_level(logging.INFO, logger="cometnmt"):
        trainer._expect_graph_per_shape()
    assert f"CUDA graphs: {len(collated)} batch shapes" in caplog.text
    assert inductor_config.triton.cudagraph_dynamic_shape_warn_limit is None


@pytest.mark.parametrize("path, expected", [("auto", None), ("conv1d", True), ("im2col", False)])
def test_check_compile_forces_the_convolution_path(data_dir, monkeypatch, path, expected):
    """bench/check_compile.py --conv-path puts every gated convolution of both trainers on the
    chosen path (conv1d: CUDA's, checkable on the CPU; im2col: the CPU's, checkable on CUDA)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile
    from cometnmt.data.pipeline import read_split
    from cometnmt.models.comet import GatedConv
    from cometnmt.training.run import training_examples

    cfg = tiny_cfg("unused", data_dir, "data.max_train_pairs=50")
    codec, data = training_examples(cfg, read_split(cfg.data, "train"))
    trainer = check_compile.build(cfg, codec, data, torch.device("cpu"), conv_path=path)
    convs = [m for m in trainer.model.modules() if isinstance(m, GatedConv)]
    assert convs and all(m.use_conv1d is expected for m in convs)
    x = torch.zeros(2, 5, convs[0].conv.in_channels)
    assert convs[0].runs_conv1d(x) == (path == "conv1d")


@pytest.mark.parametrize("corrupt", [False, True])
def test_compiled_bf16_training_is_judged_by_a_float32_reference(data_dir, monkeypatch, corrupt):
    """bench/check_compile.py in bf16 measures eager bf16 and compiled bf16 against a float32 eager
    step from the same weights, and fails compiled only when it is much further from it than eager
    bf16 is. A correct compile (inductor, CPU, COMET on CUDA's F.conv1d path) passes; a compiled
    model whose gradient of one parameter is scaled by 1.5 (a hook) fails: the check can fail."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile

    build = check_compile.build

    def corrupted(cfg, *args, **kwargs):
        trainer = build(cfg, *args, **kwargs)
        if corrupt and cfg.train.compile:
            next(trainer.model.parameters()).register_hook(lambda grad: grad * 1.5)
        return trainer

    monkeypatch.setattr(check_compile, "build", corrupted)
    lines = []
    cfg = tiny_cfg("unused", data_dir, "data.max_train_pairs=100", "train.accum_steps=1", "train.compile=true",
                   "train.precision=bf16")
    result = check_compile.check(cfg, torch.device("cpu"), n_groups=1, passes=1, log=lines.append, conv_path="conv1d")
    assert result["steps"] == 1 and "against float32" in lines[0], lines
    assert result["ok"] is not corrupt and (result["worst_margin"] > 1) is corrupt, (result, lines)


def test_check_compile_takes_suspected_causes_out(data_dir, monkeypatch):
    """bench/check_compile.py --without CAUSE ... (scripts/gpu_session.sh cgbisect2 runs each on CUDA,
    where compiled COMET's gradients failed with CUDA graphs) works as a code path: torch.compile
    faked (the compiled trainer runs eagerly), tiny COMET on CUDA's F.conv1d path with padded
    batches, every cause taken out at once. The check still passes; no custom autograd Function
    runs (without the switch both the gated convolution's and the masked batch norm's do); the
    compiled model's running statistics stay as copied in while eager's move; the compiled
    gradients come through a clone hook and its backward through the synchronising wrapper; the
    compiler settings are in force during the compiled step and restored after the check."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from cometnmt.models import comet

    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    applied = []
    for function in (comet._GatedConv1d, comet._MaskedBatchNormTrain):
        original = function.apply
        monkeypatch.setattr(function, "apply", lambda *args, original=original, name=function.__name__:
                            applied.append(name) or original(*args))
    trainers, settings = [], []
    build = check_compile.build

    def kept(cfg, *args, **kwargs):
        trainer = build(cfg, *args, **kwargs)
        trainers.append(trainer)
        if cfg.train.compile:
            trainer.model.register_forward_pre_hook(lambda *_: settings.append(
                (inductor_config.triton.cudagraph_trees, inductor_config.allow_buffer_reuse, inductor_config.inplace_buffers,
                 functorch_config.donated_buffer, dynamo_config.automatic_dynamic_shapes)))
        return trainer

    monkeypatch.setattr(check_compile, "build", kept)
    cfg = tiny_cfg("unused", data_dir, "train.accum_steps=1", "train.compile=true")
    before = (comet._MaskedBatchNormTrain, inductor_config.triton.cudagraph_trees)
    result = check_compile.check(cfg, torch.device("cpu"), n_groups=1, passes=1, log=lambda line: None, conv_path="conv1d")
    assert result["ok"] and {"_GatedConv1d", "_MaskedBatchNormTrain"} <= set(applied), (result, applied)
    applied.clear()
    trainers.clear()
    settings.clear()
    result = check_compile.check(cfg, torch.device("cpu"), n_groups=1, passes=1, log=lambda line: None,
                                 conv_path="conv1d", without=list(check_compile.CAUSES))
    assert result["ok"] and result["steps"] == 1 and applied == [], (result, applied)
    eager, compiled = trainers[:2]
    e_norm, c_norm = (next(m for m in t.model.modules() if isinstance(m, comet.MaskedBatchNorm)) for t in (eager, compiled))
    assert not torch.equal(e_norm.running_mean, torch.zeros_like(e_norm.running_mean))  # eager moved them
    assert torch.equal(c_norm.running_mean, torch.zeros_like(c_norm.running_mean))  # compiled kept the copy
    assert all(m.fused_gate is False for t in trainers for m in t.model.modules() if isinstance(m, comet.GatedConv))
    assert all(p._backward_hooks for p in compiled.model.parameters())
    assert compiled.backward.__name__ == "run"  # check_compile._synced
    assert settings and set(settings) == {(False, False, False, False, False)}, settings
    assert (comet._MaskedBatchNormTrain, inductor_config.triton.cudagraph_trees) == before
    with pytest.raises(ValueError, match="--without nothing: one of functions"):
        check_compile.check(cfg, torch.device("cpu"), n_groups=1, passes=1, log=lambda line: None, without=["nothing"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_failing_check_says_what_the_bad_gradient_looks_like(data_dir, monkeypatch, precision):
    """A failing step's line of bench/check_compile.py ends with the judged tensor's norm compiled
    and eager (and float32 in bf16), its non-finite values, the loss's error and the count of
    failing gradients and buffers, so that one GPU log tells a misrouted gradient (norm about 0)
    from garbage (orders of magnitude off). torch.compile faked; the compiled model's first
    parameter's gradient is scaled by 1000 (a hook)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import check_compile

    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    build, names = check_compile.build, []

    def corrupted(cfg, *args, **kwargs):
        trainer = build(cfg, *args, **kwargs)
        if cfg.train.compile:
            name, param = next(iter(trainer.model.named_parameters()))
            param.register_hook(lambda grad: grad * 1000)
            names.append(name)
        return trainer

    monkeypatch.setattr(check_compile, "build", corrupted)
    lines = []
    cfg = tiny_cfg("unused", data_dir, "data.max_train_pairs=100", "train.accum_steps=1", "train.compile=true",
                   f"train.precision={precision}")
    result = check_compile.check(cfg, torch.device("cpu"), n_groups=1, passes=1, log=lines.append)
    assert not result["ok"] and lines[0].endswith("FAIL"), lines
    assert f"grad {names[0]} norm compiled " in lines[0] and ", eager " in lines[0], lines
    assert (", float32 " in lines[0]) is (precision == "bf16"), lines
    assert "non-finite 0; loss error 0.0e+00; 1 gradients and 0 buffers fail" in lines[0], lines
