"""Does ``train.compile`` train the same model as eager? A correctness check, not a benchmark.

For each config, two trainers are built on the same data from the same weights: one eager, one
with ``train.compile: true`` and the given ``train.compile_mode`` (``reduce-overhead`` replays
CUDA graphs, one per batch shape). They step in lockstep over the first ``--groups`` optimizer
steps of epoch 1, taken ``--passes`` times in a row, so with CUDA graphs every shape is run
eagerly once, recorded once and then replayed. Before each step the compiled model receives the
eager model's current weights and buffers (in place, so the graphs' addresses stay valid); both
run ``Trainer.backward`` on the step's micro-batches; the loss, every parameter's gradient and
every buffer (batch-norm running statistics) must agree to a relative tolerance (norm of the
difference over the norm of the eager value); then the eager trainer takes its optimizer step,
at a constant ``--lr``. Weights change every step, so a replay that returned a stale result would
fail. In bf16 the eager step is not the truth: some gradients are rounding-sensitive (the key
projection's, where softmax's backward cancels, lie 0.2-0.4 from float32 in eager bf16 itself), so
a third, float32 eager trainer takes each step from the same weights, each tensor's error of eager
bf16 and of compiled bf16 against it is measured, and compiled fails where its error exceeds
``BF16_SLACK`` (2) times eager bf16's plus the fp32 tolerance: two roundings of the same size lie
within a factor of about 2 of each other, the additive term covers a tensor bf16 happens to hit
and CUDA's TF32 reference, and a broken compile (errors of 1e3) still fails by far. The compiled
to eager error is printed beside it. ``--conv-path`` forces COMET's gated convolutions onto
``F.conv1d`` (CUDA's path) or im2col (the CPU's) on any device. Dropout is off
in both models (a compiled model draws its own random numbers). ``--dropout`` checks those instead:
with dropout on, a compiled step taken twice from the same weights and seed repeats exactly, and
another seed changes it (``check_dropout``). ``--without CAUSE ...`` takes suspected causes of a
failure out of the check, one switch each (``CAUSES``: COMET's custom autograd Functions, the
batch-norm statistics' updates inside the graph, gradients left in the CUDA graphs' memory pool,
asynchronous streams, cudagraph trees, inductor's buffer reuse, dynamic shapes), so that one GPU call
tells which one the failure goes away without (bench/README.md, check_compile).

    python bench/check_compile.py --device cuda --mode reduce-overhead --precision bf16 \\
        --configs configs/multi30k/transformer.yaml configs/multi30k/comet_bn_length.yaml \\
                  configs/multi30k/transformer_pp_en_de.yaml

Prints one line per config and step, and exits 1 if any comparison fails; a compile error is
raised, not hidden behind the trainer's eager fallback.
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from cometnmt.config import COMPILE_MODES, Config, load_config
from cometnmt.data.pipeline import Examples, read_split
from cometnmt.data.vocab import PAD
from cometnmt.inference import set_cuda_backends
from cometnmt.models import build_model
from cometnmt.models import comet
from cometnmt.models.comet import ConvUnit, GatedConv, MaskedBatchNorm
from cometnmt.training.run import seed_everything, training_examples
from cometnmt.training.trainer import Trainer

TOLERANCE = {"fp32": 1e-2, "bf16": 5e-2}  # relative, per tensor (CUDA: TF32 matmuls in fp32); bugs give O(0.1-1)
BF16_SLACK = 2.0  # bf16: compiled may be this many times eager bf16's error from float32 (+ TOLERANCE["fp32"])
FLOOR = 1e-4  # a gradient's error is relative to at least this fraction of the whole gradient's norm


def relative_error(got: torch.Tensor, want: torch.Tensor, floor: float = 0.0) -> float:
    """||got - want|| / max(||want||, floor), in float64. The floor keeps a gradient that is zero in
    exact arithmetic (the key projection's bias: softmax ignores a constant added to every score)
    from turning rounding noise into a large relative error."""
    diff = (got.double() - want.double()).norm().item()
    scale = max(want.double().norm().item(), floor)
    return diff / scale if scale > 0 else diff


CONV_PATHS = {"auto": None, "conv1d": True, "im2col": False}  # GatedConv.use_conv1d: None = F.conv1d on CUDA only


def build(cfg: Config, codec, data, device: torch.device, dropout: bool = False, conv_path: str = "auto") -> Trainer:
    """A trainer of ``cfg``; ``conv_path`` forces COMET's gated convolutions onto ``F.conv1d`` (CUDA's
    path, incl. MultiLayerConv's channels-first training) or im2col (the CPU's), ``auto`` by device."""
    if conv_path not in CONV_PATHS:
        raise ValueError(f"conv_path {conv_path!r}: one of {', '.join(CONV_PATHS)}")
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD).to(device)
    for m in model.modules():  # no dropout anywhere (attention probabilities' included: a Dropout module too)
        if isinstance(m, torch.nn.Dropout) and not dropout:
            m.p = 0.0
        if isinstance(m, GatedConv):
            m.use_conv1d = CONV_PATHS[conv_path]
    return Trainer(cfg, model, codec, data, Examples([], [], [], []), device)


# Suspected causes of compiled training's gradients differing from eager's (the H200's reduce-overhead
# bf16 failure of 2026-11-27, bench/README.md), each with what --without CAUSE does to remove it
CAUSES = {
    "functions": "COMET's custom autograd Functions (_GatedConv1d, _CastForTwo, _MaskedBatchNormTrain) replaced by "
                 "autograd through their operators, in every trainer (pytorch/pytorch#180642, #184113: dynamo on "
                 "torch 2.11 mis-routes the gradients of an autograd.Function with an in-place op in its forward)",
    "bn-stats": "no running-statistic updates inside the compiled graph (F.batch_norm without running buffers, no "
                "bucket update); buffers are then not compared (mutated buffers under CUDA graphs)",
    "grad-pool": "each compiled gradient cloned as autograd hands it over (a hook), so no .grad lives in the "
                 "CUDA graphs' memory pool (pytorch/pytorch#169545)",
    "streams": "torch.cuda.synchronize() before and after each compiled backward (cudagraph trees warm up and "
               "record on a side stream; the batches are copied non-blocking from pinned memory)",
    "trees": "torch._inductor.config.triton.cudagraph_trees = False: the older CUDA-graph wrapper, no shared pool",
    "buffer-reuse": "inductor's allow_buffer_reuse and inplace_buffers off, AOTAutograd's donated_buffer off "
                    "(a kernel writing into memory another tensor still uses)",
    "dynamic": "torch._dynamo.config.automatic_dynamic_shapes = False: a static graph per batch shape, no symbolic sizes",
}


class _MaskedBatchNormByAutograd:
    """Stands in for ``comet._MaskedBatchNormTrain`` (``--without functions``): its forward, written with
    the same operators, differentiated by autograd instead of its written-out backward."""

    @staticmethod
    def apply(x, keep, n, weight, bias, eps: float):
        xf = x.float()
        mean = (xf * keep).sum(dim=(0, 1)) / n  # C
        centred = (xf - mean) * keep  # B,L,C, zero at padding
        var = centred.square().sum(dim=(0, 1)) / n  # C, biased
        y = torch.addcmul(bias.float(), centred * torch.rsqrt(var + eps), weight.float()) * keep
        return y, mean.detach(), var.detach()


def _native_without_running(norm: MaskedBatchNorm, x: torch.Tensor, length) -> torch.Tensor:
    """``MaskedBatchNorm._native`` without running buffers (``--without bn-stats``): batch statistics only."""
    return F.batch_norm(x, None, None, norm.weight, norm.bias, True, 0.0, norm.eps)


def _synced(backward, device: torch.device):
    """``backward`` with the device synchronised before and after (``--without streams``)."""
    def run(group, n_tokens):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        loss = backward(group, n_tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss
    return run


def remove_causes(causes, stack: ExitStack, compiled: Trainer, trainers: list[Trainer]) -> None:
    """Take each of ``causes`` (keys of CAUSES) out of the check: changes to the ``compiled`` trainer
    or to every trainer of ``trainers``, and compiler settings entered on ``stack`` (undone when it
    closes)."""
    unknown = sorted(set(causes) - set(CAUSES))
    if unknown:
        raise ValueError(f"--without {' '.join(unknown)}: one of {', '.join(CAUSES)}")
    if "functions" in causes:
        stack.enter_context(mock.patch.object(comet, "_MaskedBatchNormTrain", _MaskedBatchNormByAutograd))
        for m in (m for trainer in trainers for m in trainer.model.modules()):
            if isinstance(m, GatedConv):
                m.fused_gate = False
            if isinstance(m, ConvUnit):
                m.cast_once = False
    if "bn-stats" in causes:
        for m in compiled.model.modules():
            if isinstance(m, MaskedBatchNorm):  # instance attributes: the other trainers keep their updates
                m._update_running = lambda *args: None
                m._native = functools.partial(_native_without_running, m)
    if "grad-pool" in causes:
        for p in compiled.model.parameters():
            p.register_hook(lambda grad: grad.clone())
    if "streams" in causes:
        compiled.backward = _synced(compiled.backward, compiled.device)
    _compiler_settings(causes, stack)


def _compiler_settings(causes, stack: ExitStack) -> None:
    """The settings of ``causes`` trees, buffer-reuse and dynamic, entered on ``stack``."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    if "trees" in causes:
        stack.enter_context(inductor_config.patch({"triton.cudagraph_trees": False}))
    if "buffer-reuse" in causes:
        stack.enter_context(inductor_config.patch(allow_buffer_reuse=False, inplace_buffers=False))
        stack.enter_context(functorch_config.patch(donated_buffer=False))
    if "dynamic" in causes:
        stack.enter_context(dynamo_config.patch(automatic_dynamic_shapes=False))


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in [*trainer.model.named_parameters(), *trainer.model.named_buffers()]}


def _backward_from(trainer: Trainer, state: dict, group, n_tokens: int) -> tuple[torch.Tensor, dict]:
    """The trainer's loss and gradients on ``group`` from the weights and buffers ``state`` (copied
    in place, so CUDA graphs' addresses stay valid)."""
    with torch.no_grad():
        for name, t in [*trainer.model.named_parameters(), *trainer.model.named_buffers()]:
            t.copy_(state[name])
    trainer.optimizer.zero_grad(set_to_none=True)
    loss = trainer.backward(group, n_tokens).detach().clone()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return loss, grads


def check_dropout(cfg: Config, device: torch.device, n_groups: int, passes: int, log=print, lr: float = 3e-3,
                  conv_path: str = "auto") -> dict:
    """Compiled training with dropout on draws its masks from the trainer's per-micro-batch seed:
    the same step taken twice from the same weights gives the same loss and gradients (with CUDA
    graphs: a replay reads the generator's seed and offset, which ``torch.manual_seed`` resets),
    and the step under another ``train.seed`` gives another loss (the masks follow the seed, not
    the recording). Eager masks differ from compiled ones by design, so this compares compiled
    with compiled."""
    tol = TOLERANCE["bf16" if cfg.train.precision != "fp32" else "fp32"]
    codec, data = training_examples(cfg, read_split(cfg.data, "train"))
    cfg = copy.deepcopy(cfg)
    cfg.train.schedule, cfg.train.lr = "constant", lr
    trainer = build(cfg, codec, data, device, dropout=True, conv_path=conv_path)
    groups = trainer.epoch_batches(0)[: n_groups * cfg.train.accum_steps]
    groups = [groups[i : i + cfg.train.accum_steps] for i in range(0, len(groups), cfg.train.accum_steps)]
    worst, ok, steps, start = 0.0, True, 0, time.perf_counter()
    for p in range(passes):
        for g, group in enumerate(groups):
            n_tokens = sum(len(data.tgt_ids[i]) + 1 for idx in group for i in idx)
            state = _state(trainer)
            loss, grads = _backward_from(trainer, state, group, n_tokens)
            again, grads_again = _backward_from(trainer, state, group, n_tokens)
            trainer.tc.seed += 1
            other, _ = _backward_from(trainer, state, group, n_tokens)
            trainer.tc.seed -= 1
            floor = FLOOR * torch.linalg.vector_norm(torch.stack([t.double().norm() for t in grads.values()])).item()
            errors = {"loss": relative_error(again, loss)}
            errors.update({f"grad {name}": relative_error(grads_again[name], grad, floor) for name, grad in grads.items()})
            key = max(errors, key=errors.get)
            worst = max(worst, errors[key])
            same_masks = bool(torch.equal(other, loss))  # another seed, the same loss: the masks ignore the seed
            bad = errors[key] > tol or same_masks
            ok &= not bad
            steps += 1
            log(f"  pass {p + 1} step {g + 1}: loss {loss.item():.4f} twice, worst relative error {errors[key]:.2e} ({key}); "
                f"another seed {other.item():.4f}" + ("  FAIL" + (" (the seed changes nothing)" if same_masks else "") if bad else ""))
            _backward_from(trainer, state, group, n_tokens)
            trainer.update()  # the weights move, so a stale replay would show
    return {"ok": ok, "worst": worst, "tolerance": tol, "steps": steps, "seconds": time.perf_counter() - start}


def check(cfg: Config, device: torch.device, n_groups: int, passes: int, log=print, lr: float = 3e-3,
          conv_path: str = "auto", without=()) -> dict:
    """Compare an eager and a compiled trainer of ``cfg`` (whose train.compile_mode is used);
    returns {"ok", "worst", "tolerance", "steps", "seconds"}. A compile error propagates. Both
    train at a constant ``lr`` (the presets' warm-up would start near 0 and barely move the
    weights, and a replay of stale results needs moving weights to show). ``without``: keys of
    CAUSES taken out of the check (:func:`remove_causes`)."""
    with ExitStack() as stack:
        return _check(cfg, device, n_groups, passes, log, lr, conv_path, tuple(without), stack)


def _check(cfg: Config, device: torch.device, n_groups: int, passes: int, log, lr: float, conv_path: str,
           without: tuple[str, ...], stack: ExitStack) -> dict:
    """:func:`check`, with the settings of ``without`` entered on ``stack``."""
    tol = TOLERANCE["bf16" if cfg.train.precision != "fp32" else "fp32"]
    codec, data = training_examples(cfg, read_split(cfg.data, "train"))
    cfg = copy.deepcopy(cfg)
    cfg.train.schedule, cfg.train.lr = "constant", lr
    eager_cfg = copy.deepcopy(cfg)
    eager_cfg.train.compile, eager_cfg.train.compile_mode = False, "default"
    eager = build(eager_cfg, codec, data, device, conv_path=conv_path)
    compiled = build(cfg, codec, data, device, conv_path=conv_path)
    groups = eager.epoch_batches(0)[: n_groups * cfg.train.accum_steps]
    groups = [groups[i : i + cfg.train.accum_steps] for i in range(0, len(groups), cfg.train.accum_steps)]
    reference = None  # in bf16: a float32 eager trainer from the same weights, the one both are judged by
    if cfg.train.precision != "fp32":
        ref_cfg = copy.deepcopy(eager_cfg)
        ref_cfg.train.precision = "fp32"
        reference = build(ref_cfg, codec, data, device, conv_path=conv_path)
    remove_causes(without, stack, compiled, [eager, compiled] + ([reference] if reference is not None else []))
    buffers = "bn-stats" not in without  # compiled then keeps no running statistics: nothing to compare
    e_params, c_params = dict(eager.model.named_parameters()), dict(compiled.model.named_parameters())
    e_bufs, c_bufs = dict(eager.model.named_buffers()), dict(compiled.model.named_buffers())
    worst, worst_margin, ok, steps, start = 0.0, 0.0, True, 0, time.perf_counter()
    for p in range(passes):
        for g, group in enumerate(groups):
            followers = [compiled] + ([reference] if reference is not None else [])
            with torch.no_grad():  # the eager model's state, copied in place
                for follower in followers:
                    for name, t in [*follower.model.named_parameters(), *follower.model.named_buffers()]:
                        t.copy_(e_params[name] if name in e_params else e_bufs[name])
            n_tokens = sum(len(data.tgt_ids[i]) + 1 for idx in group for i in idx)
            e_loss = eager.backward(group, n_tokens)
            c_loss = compiled.backward(group, n_tokens)  # no eager fallback here: a compile error propagates
            e_out, c_out = _outputs(eager, e_loss, buffers), _outputs(compiled, c_loss, buffers)
            errors = _errors(c_out, e_out)  # compiled against eager
            key = max(errors, key=errors.get)
            worst = max(worst, errors[key])
            line = f"  pass {p + 1} step {g + 1}: loss {e_loss.item():.4f}, worst relative error {errors[key]:.2e} ({key})"
            if reference is None:
                bad = errors[key] > tol
                if bad:
                    line += "; " + _failure_shape(key, c_out, e_out, None, errors, tol)
            else:
                r_loss = reference.backward(group, n_tokens)
                r_out = _outputs(reference, r_loss, buffers)
                e_errors, c_errors = _errors(e_out, r_out), _errors(c_out, r_out)
                margins = {name: c_errors[name] / (BF16_SLACK * e_errors[name] + TOLERANCE["fp32"]) for name in c_errors}
                judged = max(margins, key=margins.get)
                worst_margin = max(worst_margin, margins[judged])
                bad = margins[judged] > 1
                line += (f"; against float32: compiled {c_errors[judged]:.2e}, eager {e_errors[judged]:.2e} ({judged}, "
                         f"{margins[judged]:.2f} of the allowed {BF16_SLACK:g} x eager + {TOLERANCE['fp32']:.0e})")
                failing = [name for name in margins if margins[name] > 1 and name != judged]
                if bad and failing:
                    line += "; also " + ", ".join(
                        f"{name} {c_errors[name]:.2e} / {e_errors[name]:.2e}" for name in sorted(failing, key=margins.get)[::-1][:5])
                if bad:
                    line += "; " + _failure_shape(judged, c_out, e_out, r_out, margins)
                reference.optimizer.zero_grad(set_to_none=True)
            ok &= not bad
            steps += 1
            log(line + ("  FAIL" if bad else ""))
            eager.update()
            compiled.optimizer.zero_grad(set_to_none=True)
    result = {"ok": ok, "worst": worst, "tolerance": tol, "steps": steps, "seconds": time.perf_counter() - start}
    if reference is not None:
        result["worst_margin"] = worst_margin
    return result


def _outputs(trainer: Trainer, loss: torch.Tensor, buffers: bool = True) -> dict[str, torch.Tensor]:
    """A step's loss, every parameter's gradient (zeros where none) and every buffer (unless not
    ``buffers``), by name."""
    out = {"loss": loss.detach()}
    for name, param in trainer.model.named_parameters():
        out[f"grad {name}"] = param.grad if param.grad is not None else torch.zeros_like(param)
    if buffers:
        out.update({f"buffer {name}": value for name, value in trainer.model.named_buffers()})
    return out


def _failure_shape(judged: str, got: dict, eager: dict, reference, scores: dict, limit: float = 1.0) -> str:
    """What a failing step's compiled outputs look like, to tell causes apart in one log line: the
    judged tensor's norm against eager's (about 0: a gradient routed elsewhere or never written;
    orders of magnitude off: garbage or stale memory; inf/nan: uninitialised memory), the loss's
    relative error, and how many tensors fail, gradients and buffers apart."""
    norm = lambda t: t.double().norm().item()  # noqa: E731
    failing = [name for name in scores if scores[name] > limit]
    parts = [f"{judged} norm compiled {norm(got[judged]):.3e}, eager {norm(eager[judged]):.3e}"
             + (f", float32 {norm(reference[judged]):.3e}" if reference is not None else ""),
             f"non-finite {int((~torch.isfinite(got[judged])).sum())}",
             f"loss error {relative_error(got['loss'], eager['loss']):.1e}",
             f"{sum(n.startswith('grad ') for n in failing)} gradients and {sum(n.startswith('buffer ') for n in failing)} "
             f"buffers fail"]
    return "; ".join(parts)


def _errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative error of each tensor of ``got`` against ``want``'s (gradients with FLOOR of the whole
    gradient's norm; an integer buffer: 1 unless equal)."""
    grads = [t.double().norm() for name, t in want.items() if name.startswith("grad ")]
    floor = FLOOR * torch.linalg.vector_norm(torch.stack(grads)).item()
    errors = {}
    for name, value in want.items():
        if not value.is_floating_point():
            errors[name] = float(not torch.equal(got[name], value))
        else:
            errors[name] = relative_error(got[name], value, floor if name.startswith("grad ") else 0.0)
    return errors


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", type=Path, required=True, help="config files (presets) to check")
    p.add_argument("--mode", choices=COMPILE_MODES, default="default", help="train.compile_mode of the compiled trainer")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--groups", type=int, default=3, help="distinct optimizer steps (batch shapes) per pass")
    p.add_argument("--passes", type=int, default=3, help="times the steps are taken (CUDA graphs replay from the 3rd)")
    p.add_argument("--max-pairs", type=int, default=2000, help="training pairs to read")
    p.add_argument("--lr", type=float, default=3e-3, help="constant learning rate of both trainers")
    p.add_argument("--conv-path", choices=list(CONV_PATHS), default="auto",
                   help="COMET's gated convolutions: F.conv1d (CUDA's path), im2col (the CPU's), or auto (by device)")
    p.add_argument("--without", nargs="+", choices=list(CAUSES), default=[], metavar="CAUSE",
                   help="take suspected causes of a failure out of the check: " + "; ".join(
                       f"{name}: {what}" for name, what in CAUSES.items()))
    p.add_argument("--set", action="append", default=[], help="config override for every config")
    p.add_argument("--dropout", action="store_true",
                   help="instead: with dropout on, compiled training repeats a step exactly from the same weights and "
                        "seed, and another seed changes it (the per-micro-batch seeds reach the compiled masks)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = torch.device(args.device)
    if device.type == "cuda":
        set_cuda_backends(True)
    failed = []
    for path in args.configs:
        cfg = load_config(path, [f"data.max_train_pairs={args.max_pairs}", f"train.precision={args.precision}",
                                 "train.compile=true", f"train.compile_mode={args.mode}", "train.progress=false", *args.set])
        what = "with dropout, compiled twice" if args.dropout else "eager against"
        print(f"{path.name}: {what} compile_mode={args.mode} on {device}, {args.precision}, conv path {args.conv_path}"
              + (f", without {' '.join(args.without)}" if args.without else ""), flush=True)
        log = lambda line: print(line, flush=True)  # noqa: E731
        if args.dropout:
            if args.without:
                p.error("--without applies to the comparison with eager, not to --dropout")
            result = check_dropout(cfg, device, args.groups, args.passes, log=log, lr=args.lr, conv_path=args.conv_path)
        else:
            result = check(cfg, device, args.groups, args.passes, log=log, lr=args.lr, conv_path=args.conv_path,
                           without=args.without)
        verdict = "ok" if result["ok"] else "FAIL"
        judged = (f"worst relative error {result['worst']:.2e} (tolerance {result['tolerance']:.0e})" if "worst_margin" not in result
                  else f"worst relative error to eager bf16 {result['worst']:.2e}, against float32 at most "
                       f"{result['worst_margin']:.2f} of the allowed {BF16_SLACK:g} x eager bf16's + {TOLERANCE['fp32']:.0e}")
        label = path.name + (f" (without {' '.join(args.without)})" if args.without else "")
        print(f"{label}: {verdict}: {judged} over {result['steps']} steps, {result['seconds']:.0f} s", flush=True)
        if not result["ok"]:
            failed.append(path.name)
    if failed:
        print(f"compiled training {'with dropout does not repeat' if args.dropout else 'differs from eager'}: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
