"""COMET: the Transformer with a convolution unit in place of the encoder feed-forward sublayer.

Paper: "Improved Transformer Architecture for Sequence to Sequence Translation" (COMET),
sections 2.2, 3.1, 3.4, 5.2-5.4.

* GatedConv (eq. 3): g(x) = tanh(k_f * x) ⊙ sigmoid(k_s * x), a 1-D convolution along the sequence,
  kernel 3, dilation l, l zeros of padding on both ends (section 3.1).
* MultiLayerConv: F1 = BN(g_{d,64,1}(x)), F2 = BN(g_{64,32,2}(F1)), F3 = BN(g_{32,16,3}(F2)).
* ConvUnit: y = LeakyReLU(W concat(F1, F2, F3, x) + b), W in R^{d x (d+112)} (eq. 4 with a leaky ReLU).
* Variants of Table 1: FFN-1 and FFN-2 units (section 5.3), a 4-layer unit with F4 at dilation 4
  (section 5.4), and temporal convolutions replacing the decoder feed-forward (section 5.2), padded
  on the left by 2l so that they are strictly causal. The source SOS/EOS variant is a data option
  (``data.src_sos_eos``).

Choices the paper leaves open, made here:
* Padding never leaks into real positions: padded positions are zeroed before every convolution
  and batch-norm statistics are computed over real tokens only (``MaskedBatchNorm``). A sentence
  therefore encodes identically alone or inside a padded batch (in eval mode).
* F4 of the 4-layer unit has 8 features (the paper halves the width at each layer but does not
  give F4's size); ``comet.features`` sets it.
* The leaky ReLU slope is PyTorch's default, 0.01 (``comet.leaky_slope``).
* The temporal-convolution decoder keeps batch norm, as the paper's "all other features identical"
  says. Its convolutions are causal, but in training its batch statistics are means over all target
  positions of the batch, later tokens and the other sentences' gold targets included, so a
  token's normalisation carries information that translation never has. In evaluation (running
  statistics) the decoder is strictly causal, and its incremental step equals the full decode.
  On a temporal-convolution COMET trained to the stopping rule on the CPU, teacher-forced
  validation loss is 1.99 nats a token with the running statistics, 1.80 with those of a
  neighbouring validation batch (sentences of about the same length) and 1.72 with each batch's
  own: the decoder's statistics depend on length far more than the encoder's, and a little on the
  batch's own targets (scripts/decoder_bn_leak.py, reports/temporal_conv_decoder_bn_cpu).
  ``comet.decoder_batch_norm: false`` drops this batch norm; mixed-length batches
  (``train.bucket_width``) remove the length part and did better still in that report.

Not in the paper, off by default: ``comet.bn_length_bounds`` keeps the encoder's batch-norm running
statistics per source-length bucket. Training batches are cut from length buckets, so batch norm
normalises short sentences with short-sentence statistics in training, while one running average
over all lengths serves every sentence at test time; ``scripts/batchnorm_by_length.py`` measured
that mismatch on a trained COMET (reports/multi30k_label_smoothing_cpu/batchnorm_by_length.md).
With the option, a training batch updates the statistics of its mean length's bucket and, in
evaluation, each sentence is normalised with its own length's. A sentence's statistics depend on
its length alone, so padding invariance holds.

Also not in the paper, off by default: ``comet.decoder_bn_length_bounds`` does the same for the
temporal-convolution decoder's batch norms, keyed by the *source* length (the target's is unknown
while translating). A training batch moves the statistics of its mean source length's bucket; in
evaluation every target position of a sentence is normalised with its source length's statistics,
in the full decode, in the incremental step (the state keeps each source's length) and through beam
search's reordering. Decoding stays causal and the step equals the full decode. This keeps the
paper's batch norm and removes the length mismatch that reports/temporal_conv_decoder_bn_cpu
measured (scripts/batchnorm_by_length.py re-estimated those statistics post hoc). Trained once on the
CPU: 38.34 on the paper's metric on test against Table 1's preset's 34.40; the same weights decoded
with pooled statistics score 32.99 (scripts/bn_length_ablation.py, same report).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from cometnmt.errors import ConfigError
from cometnmt.models.transformer import FeedForward, Transformer, transformer_from_config
from cometnmt.modules.dropout import Dropout


@dataclass
class CometConfig:
    """Hyper-parameters of the convolution unit (``model.comet.*``)."""

    features: list[int] = field(default_factory=lambda: [64, 32, 16])  # n_f of F1, F2, F3 (, F4)
    dilations: list[int] = field(default_factory=lambda: [1, 2, 3])  # dilation l of each layer's gated convolution, one per features entry
    kernel_size: int = 3  # width of every gated convolution (encoder and temporal-conv decoder alike)
    unit: Literal["conv", "ffn1", "ffn2"] = "conv"  # conv: the convolution unit (section 3.1); ffn1, ffn2: Table 1's FFN-1, FFN-2 (section 5.3)
    ffn1_hidden: int = 512  # FFN-1: hidden size of the FFN_2 over concat(F1..F3)
    ffn2_hidden: int = 1024  # FFN-2: hidden size of the FFN_2 over concat(F1..F3, x)
    leaky_slope: float = 0.01  # negative slope of the leaky ReLU on the unit's output (conv, ffn1; ffn2 has none)
    batch_norm: bool = True  # batch norm over real tokens after each gated convolution (encoder, temporal-conv decoder); false: none
    decoder: Literal["ffn", "temporal_conv"] = "ffn"  # ffn: FFN_2 (model.d_ff); temporal_conv: causal convolution units (section 5.2)
    # The temporal-convolution decoder's batch norm (the paper keeps it: "all other features
    # identical"). False: its convolutions only zero padding, no normalisation. Its statistics depend
    # on length, and in training they come from the batch's teacher-forced targets, later and other
    # sentences' gold tokens included (see the module docstring).
    decoder_batch_norm: bool = True  # false: no batch norm in the temporal-convolution decoder (not in the paper)
    # Encoder batch norm: running statistics per source-length bucket (not in the paper; see the
    # module docstring). Inclusive upper bounds on a sentence's real source positions, ascending,
    # e.g. [8, 11, 14, 18]: buckets <= 8, 9-11, 12-14, 15-18, > 18. None: one set of statistics.
    bn_length_bounds: Optional[list[int]] = None  # per-length encoder BN statistics (not in the paper), e.g. [8, 11, 14, 18]; null: one set
    # The temporal-convolution decoder's batch norm, per source-length bucket (not in the paper; the
    # same bounds' meaning, on the source sentence's real positions). None: one set of statistics.
    decoder_bn_length_bounds: Optional[list[int]] = None  # per-source-length decoder BN statistics (not in the paper); null: one set

    def __post_init__(self) -> None:
        key = "model.comet.{}".format
        if not self.features or any(n < 1 for n in self.features):
            raise ConfigError.at(key("features"), f"needs at least one layer, each of at least 1 feature map, got {self.features}")
        if len(self.dilations) != len(self.features) or any(d < 1 for d in self.dilations):
            raise ConfigError.at(key("dilations"), f"one dilation of at least 1 per layer of model.comet.features "
                                 f"({len(self.features)}), got {self.dilations}", also=(key("features"),))
        for name in ("kernel_size", "ffn1_hidden", "ffn2_hidden"):
            if getattr(self, name) < 1:
                raise ConfigError.at(key(name), f"must be at least 1, got {getattr(self, name)}")
        if not math.isfinite(self.leaky_slope):  # nan or inf: every unit's output nan, the loss nan from the first step
            raise ConfigError.at(key("leaky_slope"), f"must be a finite number, got {self.leaky_slope}")
        if not self.decoder_batch_norm and self.decoder != "temporal_conv":
            raise ConfigError.at(key("decoder_batch_norm"), f"false only applies to a temporal-convolution decoder "
                                 f"(model.comet.decoder: temporal_conv), got decoder {self.decoder!r}",
                                 also=(key("decoder"),))
        for name in ("bn_length_bounds", "decoder_bn_length_bounds"):
            bounds = getattr(self, name)
            if bounds is not None and (not bounds or any(b < 1 for b in bounds) or bounds != sorted(set(bounds))):
                raise ConfigError.at(key(name), f"ascending positive source lengths (or null), got {bounds}")
        if self.bn_length_bounds is not None and not self.batch_norm:
            raise ConfigError.at(key("bn_length_bounds"), f"only applies with batch norm (model.comet.batch_norm true), "
                                 f"got batch_norm {self.batch_norm}", also=(key("batch_norm"),))
        if self.decoder_bn_length_bounds is not None and not (
                self.decoder == "temporal_conv" and self.batch_norm and self.decoder_batch_norm):
            raise ConfigError.at(key("decoder_bn_length_bounds"), f"only applies to a temporal-convolution decoder with "
                                 f"batch norm (model.comet.decoder: temporal_conv, batch_norm and decoder_batch_norm true), "
                                 f"got decoder {self.decoder!r}, batch_norm {self.batch_norm}, "
                                 f"decoder_batch_norm {self.decoder_batch_norm}",
                                 also=tuple(key(name) for name in ("decoder", "batch_norm", "decoder_batch_norm")))


class PaddingStatistics(NamedTuple):
    """What training-mode :class:`MaskedBatchNorm` derives from the padding alone (and the given
    lengths), the same for every batch norm that sees one pad mask: :class:`MultiLayerConv` computes
    it once per forward and passes it to each of its 3 (4) norms, which each derived it themselves
    (6 operators a norm on a padded batch)."""

    keep: torch.Tensor  # B,L,1 float32: 1 at real positions, 0 at padding
    n: torch.Tensor  # 0-dim float32: the number of real positions
    n_less_one: torch.Tensor  # 0-dim: n - 1, at least 1 (the divisor of the unbiased variance)
    mean_length: torch.Tensor  # 0-dim: the batch's mean real length n / B, or the mean of the given lengths


class SharedPadding(NamedTuple):
    """What the batch norms of :class:`MultiLayerConv` derive from one pad mask (and the given
    source lengths) alone: computed by :meth:`MultiLayerConv.shared_padding` once per forward and
    shared by the stacks of every unit of an encoder or decoder (``Transformer.encode`` and
    ``decode``), which each derived it again (6 operators a unit on a padded training batch)."""

    statistics: Optional[PaddingStatistics]  # training, padded, with batch norm: MaskedBatchNorm's padding
    lengths: Optional[torch.Tensor]  # B: the lengths that key per-length statistics (None: x's own, or no buckets)


class MaskedBatchNorm(nn.Module):
    """Batch normalisation over the channels of B,L,C inputs whose statistics ignore padding.

    Training: mean and (biased) variance over real positions only, computed in float32 (float64
    kept: :func:`_statistics_dtype`); running
    statistics updated with ``momentum`` (unbiased variance, as ``nn.BatchNorm1d``). Eval: running
    statistics (per length with ``length_bounds``: by default the length of each row of x itself,
    the encoder's source; given ``lengths``, those, the decoder's source lengths). Padded outputs are zero; in evaluation
    outputs keep the memory layout of the input; nothing waits on the GPU. Training runs through
    :class:`_MaskedBatchNormTrain` (its backward written out); :meth:`moments` is the same
    statistics for scripts/batchnorm_by_length.py.
    """

    def __init__(self, channels: int, momentum: float = 0.1, eps: float = 1e-5,
                 length_bounds: Optional[list[int]] = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.length_bounds = list(length_bounds or [])
        if self.length_bounds and (any(b < 1 for b in self.length_bounds) or self.length_bounds != sorted(set(self.length_bounds))):
            raise ValueError(f"comet.bn_length_bounds must be ascending positive lengths, got {self.length_bounds}")
        # with length buckets: rows 0..K the K+1 buckets, row K+1 all lengths pooled (for buckets no
        # training batch reached); bucket_batches counts each row's updates
        shape = (len(self.length_bounds) + 2, channels) if self.length_bounds else (channels,)
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        if self.length_bounds:
            self.register_buffer("bounds", torch.tensor(self.length_bounds, dtype=torch.float32), persistent=False)
            self.register_buffer("bucket_batches", torch.zeros(len(self.length_bounds) + 2, dtype=torch.long))
        self.momentum = momentum
        self.eps = eps
        # Set under DDP (cometnmt.training.distributed.SyncedRunningStatistics): a training forward
        # leaves its batch's (mean, unbiased variance, mean length) in ``recorded`` instead of moving
        # the running statistics, and :meth:`replay` applies every rank's records in the global order
        # of the micro-batches, so that all ranks keep the statistics one process would.
        self.defer_running = False
        self.register_buffer("recorded", torch.zeros(2 * channels + 1), persistent=False)
        # (bucket_batches as last written here, its version then, its values as a host list): see _host_counts
        self._counts_mirror: Optional[tuple[torch.Tensor, int, list[int]]] = None
        # the last unpadded training batch's mean and unbiased variance, written by the batch-norm kernel
        # (momentum 1) for the per-length and deferred updates (:meth:`_native`)
        self.register_buffer("batch_mean", torch.zeros(channels), persistent=False)
        self.register_buffer("batch_var", torch.ones(channels), persistent=False)

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                lengths: Optional[torch.Tensor] = None, padding: Optional[PaddingStatistics] = None) -> torch.Tensor:
        """x B,L,C; pad_mask B,L (True = padding) or None -> B,L,C, zero at padding. ``lengths`` (B)
        keys the per-length statistics instead of x's own real lengths (the decoder: source lengths).
        ``padding``: :meth:`padding_statistics` of the same pad_mask and lengths, if already computed."""
        if self.training:
            if pad_mask is None and x.shape[0] * x.shape[1] > 1:  # no padding: PyTorch's own batch norm
                return self._train_unpadded(x, lengths)
            p = self.padding_statistics(x, pad_mask, lengths) if padding is None else padding
            y, mean, var = _MaskedBatchNormTrain.apply(x, p.keep, p.n, self.weight, self.bias, self.eps)
            with torch.no_grad():
                self._update_running(mean, var * p.n / p.n_less_one, p.mean_length)
            return y
        if self.length_bounds:  # each sentence with its own length's statistics: B,1,C
            if lengths is None:
                lengths = (x.new_full((x.shape[0],), float(x.shape[1])) if pad_mask is None
                           else (~pad_mask).sum(dim=1))
            k = torch.bucketize(lengths.to(self.bounds.dtype), self.bounds)  # B
            k = torch.where(self.bucket_batches[k] > 0, k, len(self.length_bounds) + 1)  # unseen bucket: pooled
            mean, var = self.running_mean[k].unsqueeze(1), self.running_var[k].unsqueeze(1)
        else:
            mean, var = self.running_mean, self.running_var
        # (x - mean) / sqrt(var + eps) * weight + bias, folded into one multiply-add per element
        scale = self.weight * torch.rsqrt(var + self.eps)  # C (B,1,C per length)
        shift = self.bias - mean * scale  # C (B,1,C)
        y = torch.addcmul(shift, x, scale)  # B,L,C, in the memory layout of x
        return y if pad_mask is None else y.masked_fill_(pad_mask.unsqueeze(-1), 0.0)  # in place: keeps the layout

    @classmethod
    def padding_statistics(cls, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                           lengths: Optional[torch.Tensor] = None) -> PaddingStatistics:
        """The training path's statistics of the padding of x B,L,.. (pad_mask B,L or None: all
        real) and of the given ``lengths`` (B, or None: x's own real lengths), on the device."""
        keep = (x.new_ones(x.shape[0], x.shape[1], 1, dtype=torch.float32) if pad_mask is None
                else (~pad_mask).unsqueeze(-1).float())  # B,L,1
        n = keep.sum()
        mean_length = n / x.shape[0] if lengths is None else cls._mean_length(lengths)
        return PaddingStatistics(keep, n, (n - 1).clamp(min=1), mean_length)

    @staticmethod
    def _mean_length(lengths: torch.Tensor) -> torch.Tensor:
        """The batch's mean of given lengths, a 0-dim float32 tensor (on the device: no sync)."""
        return lengths.float().mean()

    def _train_unpadded(self, x: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Training mode on a batch without padding: PyTorch's batch norm over the B*L positions in
        float32 (one kernel forward and one backward on a GPU, against some 30 operators of the
        masked path), the same statistics and float32 output as the masked path with no padding."""
        flat = _statistics_dtype(x).reshape(-1, x.shape[-1])  # B*L,C
        return self._native(flat, x.shape[1] if lengths is None else self._mean_length(lengths)).view(x.shape)

    def train_channels_first(self, x: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Training mode on an unpadded batch in the convolutions' own layout, x B,C,L (the GPU
        path of :class:`MultiLayerConv`): PyTorch's batch norm as is, in the input's dtype (under bf16
        autocast the kernel takes bf16 with float32 weights and statistics and accumulates in
        float32), so no cast or copy goes in or out. The same statistics as :meth:`_train_unpadded`."""
        return self._native(x, x.shape[2] if lengths is None else self._mean_length(lengths))

    def _native(self, x: torch.Tensor, length: int | torch.Tensor) -> torch.Tensor:
        """PyTorch's batch norm of x, channels in dim 1, statistics over every other dim, in training mode;
        ``length`` keys the per-length statistics (every row's length, or a 0-dim tensor of the
        given lengths' mean)."""
        # torch.native_batch_norm, the kernel F.batch_norm reaches on the CPU and, for bf16, on CUDA,
        # called directly: F.batch_norm's dispatch also allocates an empty reserve tensor (one
        # operator more a call, no kernel); the same outputs, gradients and statistics, bit for bit.
        # (CUDA's float32 took cuDNN's kernel through F.batch_norm; now PyTorch's own, as bf16 does)
        if not self.length_bounds and not self.defer_running:  # PyTorch's running update: momentum, unbiased variance, as ours
            return torch.native_batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, True,
                                           self.momentum, self.eps)[0]
        # momentum 1: the kernel writes the batch's own mean and unbiased variance into the scratch
        # buffers (no var_mean, no float32 copy of x)
        y = torch.native_batch_norm(x, self.weight, self.bias, self.batch_mean, self.batch_var, True, 1.0, self.eps)[0]
        with torch.no_grad():
            self._update_running(self.batch_mean, self.batch_var, length if isinstance(length, torch.Tensor) else float(length))
        return y

    def _update_running(self, mean: torch.Tensor, unbiased: torch.Tensor, mean_length: torch.Tensor | float) -> None:
        """Move the running statistics towards a training batch's (mean, unbiased variance); with
        length buckets, the row of the batch's mean real sentence length and the pooled row. The
        length is a tensor where it is only known on the device (a padded batch: no sync), a number
        where the host knows it (an unpadded batch: rows picked on the host, fewer operators).
        With ``defer_running`` it only records them, for :meth:`replay`."""
        if self.defer_running:
            if not isinstance(mean_length, torch.Tensor):  # a fill: no host-to-device copy
                mean_length = mean.new_full((), mean_length)
            self.recorded.copy_(torch.cat([mean.detach().float(), unbiased.detach().float(), mean_length.detach().float().view(1)]))
            return
        self._apply_running(mean, unbiased, mean_length)

    def replay(self, record: torch.Tensor) -> None:
        """Move the running statistics as a training batch whose ``recorded`` was ``record`` did
        (this rank's or another's micro-batch; a 0-dim length picks the rows on the device)."""
        C = self.weight.shape[0]
        self._apply_running(record[:C], record[C : 2 * C], record[2 * C])

    def _apply_running(self, mean: torch.Tensor, unbiased: torch.Tensor, mean_length: torch.Tensor | float) -> None:
        if not self.length_bounds:
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), self.momentum)
            return
        if torch.compiler.is_compiling() and not isinstance(mean_length, torch.Tensor):
            # compiled: choose on the device, where the length stays symbolic. On the host the choice
            # broke the graph (bisect cannot be traced) and would specialise it on the bucket (one
            # recompilation per bucket)
            mean_length = mean.new_full((), mean_length)
        if not isinstance(mean_length, torch.Tensor):  # the same rows and weights as below, chosen on the host
            self._apply_running_host(mean, unbiased, bisect.bisect_left(self.length_bounds, round(mean_length)))
            return
        k = torch.bucketize(torch.round(mean_length), self.bounds).view(1)
        rows = torch.cat([k, k.new_full((1,), len(self.length_bounds) + 1)])  # 2
        # a row's first updates average its batches (weight 1/count) until momentum takes over, so a
        # rarely reached bucket does not keep most of its initial 0 / 1
        weight = (1.0 / (self.bucket_batches[rows] + 1)).clamp(min=self.momentum).unsqueeze(1)  # 2,1
        for buf, new in ((self.running_mean, mean), (self.running_var, unbiased)):
            row = buf.index_select(0, rows)
            buf.index_copy_(0, rows, row.lerp_(new.detach().to(buf.dtype).expand_as(row), weight.to(buf.dtype)))
        self.bucket_batches.index_add_(0, rows, torch.ones_like(rows))

    def _apply_running_host(self, mean: torch.Tensor, unbiased: torch.Tensor, row: int) -> None:
        """:meth:`_apply_running` for a bucket ``row`` known on the host (an unpadded batch), with
        the update weights computed on the host too, from a host copy of ``bucket_batches``: 3
        operators once the two rows' weights are equal, where computing the weights on the device
        took 12 (a GPU step at Multi30k's batch sizes is bound by kernel launches). The bucket's row and the pooled row are one strided view of each buffer,
        so once both rows have seen 1/momentum batches (equal weights) each buffer moves in one
        ``lerp_``. The host copy is read from the buffer (one device sync) only when the buffer
        changed otherwise since: a checkpoint loaded, the device path, :meth:`replay`, a move."""
        counts = self._host_counts()
        pooled = len(self.length_bounds) + 1
        weights = [max(1.0 / (counts[r] + 1), self.momentum) for r in (row, pooled)]
        for buf, new in ((self.running_mean, mean), (self.running_var, unbiased)):
            new = new.detach().to(buf.dtype)
            if weights[0] == weights[1]:
                _two_rows(buf, row, pooled).lerp_(new.expand(2, -1), weights[0])
            else:
                for r, w in zip((row, pooled), weights):
                    buf[r].lerp_(new, w)
        _two_rows(self.bucket_batches, row, pooled).add_(1)
        counts[row] += 1
        counts[pooled] += 1
        self._counts_mirror = (self.bucket_batches, self.bucket_batches._version, counts)

    def _host_counts(self) -> list[int]:
        """``bucket_batches`` as a host list, read from the device only if the buffer was replaced
        or written since this module last wrote it (its in-place version counter moved)."""
        mirror, buf = self._counts_mirror, self.bucket_batches
        if mirror is not None and mirror[0] is buf and mirror[1] == buf._version:
            return mirror[2]
        return buf.tolist()

    @staticmethod
    def moments(x: torch.Tensor, pad_mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Float32 mean and biased variance per channel over the real positions of x B,L,C, and
        their number (a tensor: no host sync on a GPU)."""
        xf = x.float()
        if pad_mask is None:
            var, mean = torch.var_mean(xf, dim=(0, 1), correction=0)  # C each
            return mean, var, xf.new_full((), float(x.shape[0] * x.shape[1]))  # a fill: no host-to-device copy
        keep = (~pad_mask).unsqueeze(-1).float()  # B,L,1
        n = keep.sum()
        mean = (xf * keep).sum(dim=(0, 1)) / n  # C
        centred = (xf - mean) * keep  # B,L,C, zero at padding
        var = torch.linalg.vector_norm(centred, dim=(0, 1)).square() / n  # C
        return mean, var, n


def _statistics_dtype(x: torch.Tensor) -> torch.Tensor:
    """x in float32 for training batch norm's statistics, float64 kept (as autocast keeps it for
    F.linear and F.conv1d): a float64 model's maps cast to float32 met its float64 weights in
    F.batch_norm ("mixed dtype (CPU): expect parameter to have scalar type of Float") or, padded,
    in the next convolution's F.linear ("mat1 and mat2 must have the same dtype")."""
    return x if x.dtype == torch.float64 else x.float()


def _two_rows(buf: torch.Tensor, first: int, second: int) -> torch.Tensor:
    """Rows ``first`` < ``second`` of buf (R or R,C) as one view 2 or 2,C (no copy: writes reach buf)."""
    step = (second - first) * buf.stride(0)
    return buf.as_strided((2, *buf.shape[1:]), (step, *buf.stride()[1:]), buf.storage_offset() + first * buf.stride(0))


class _MaskedBatchNormTrain(torch.autograd.Function):
    """Training-mode batch norm over the real positions (``keep`` B,L,1 = 1) of x B,L,C, with the
    textbook backward written out: dx = w·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)) over real positions.
    Autograd through the masked mean and variance dispatched 58 operators per call (forward and
    backward); this does it in about half, and a GPU step at Multi30k's batch sizes is bound by
    launches. Takes the count n = keep.sum() of real positions (:class:`PaddingStatistics`, shared
    by the norms of a stack). Returns y (float32, or float64 for a float64 x; zero at padding) and
    the mean and biased variance in its dtype (for the running statistics; no gradient)."""

    @staticmethod
    def forward(ctx, x, keep, n, weight, bias, eps: float):
        xf = _statistics_dtype(x)
        kept = xf * keep  # B,L,C, zero at padding
        mean = kept.sum(dim=(0, 1)) / n  # C
        # (x - mean) * keep as kept - keep * mean: one operator where a subtraction and a product were
        # two, the same numbers (x - mean where keep is 1, zero where it is 0: the products are exact)
        centred = torch.addcmul(kept, keep, mean, value=-1)  # B,L,C, zero at padding
        var = centred.square().sum(dim=(0, 1)) / n  # C, biased
        rstd = torch.rsqrt(var + eps)
        xhat = centred * rstd  # zero at padding
        y = torch.addcmul(bias.to(xf.dtype), xhat, weight.to(xf.dtype)) * keep
        ctx.save_for_backward(xhat, keep, weight, rstd, n)
        ctx.x_dtype = x.dtype
        ctx.mark_non_differentiable(mean, var)
        ctx.set_materialize_grads(False)  # no zero tensors for the gradients of mean and var
        return y, mean, var

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar):
        xhat, keep, weight, rstd, n = ctx.saved_tensors
        dy = dy.to(xhat.dtype) * keep  # padded outputs are constant zeros
        dbias = dy.sum(dim=(0, 1))
        dweight = (dy * xhat).sum(dim=(0, 1))
        dx = (dy - dbias / n - xhat * (dweight / n)) * (weight.to(xhat.dtype) * rstd) * keep
        return dx.to(ctx.x_dtype), None, None, dweight.to(weight.dtype), dbias.to(weight.dtype), None


class GatedConv(nn.Module):
    """tanh(k_f * x) ⊙ sigmoid(k_s * x) (eq. 3); both kernels in one Conv1d of 2*n_f channels.

    ``causal=False``: l zeros on both ends (encoder, section 3.1). ``causal=True``: (K-1)*l zeros on
    the left only (temporal convolution, section 5.2), so position t sees t-(K-1)l .. t.

    The convolution runs as one matrix product over the K dilated shifts of the channels-last input
    (im2col): the Conv1d's own weight, read as 2n_f x (K*C_in). On the CPU this is 1.4x faster than
    ``F.conv1d`` forward + backward at the paper's sizes (bench/README.md) and needs no transposes;
    a test checks it against ``F.conv1d``. On a GPU (``use_conv1d`` None = on CUDA) it runs as one
    ``F.conv1d`` instead, in training with the gate as one autograd Function (:class:`_GatedConv1d`):
    10 operators forward and backward against im2col's 25 (a B,L,C call and a sum's backward,
    counted on the CPU), and a GPU step at Multi30k's batch sizes is bound by kernel launches
    (bench/README.md). ``fused_gate = False`` trains through autograd of ``F.conv1d`` and the gate
    instead (the path before the Function; bench.py's ``comet@unfused`` times the two side by side).
    """

    def __init__(self, d_in: int, n_f: int, kernel_size: int, dilation: int, causal: bool) -> None:
        super().__init__()
        self.conv = nn.Conv1d(d_in, 2 * n_f, kernel_size, dilation=dilation)
        self.causal = causal
        self.context = (kernel_size - 1) * dilation  # positions of history the kernel spans
        self.pad = (self.context, 0) if causal else (self.context // 2, self.context - self.context // 2)
        self.use_conv1d: Optional[bool] = None  # None: F.conv1d on CUDA, im2col elsewhere
        self.fused_gate = True  # F.conv1d's training path: the gate in _GatedConv1d (False: autograd's ops)

    def matrix(self) -> torch.Tensor:
        """The kernel as 2n_f x (K*C_in), shift-major: column k*C_in + c is weight[:, c, k]."""
        return self.conv.weight.permute(0, 2, 1).reshape(self.conv.out_channels, -1)

    def shifts(self, xp: torch.Tensor, length: int) -> torch.Tensor:
        """xp B,length+(K-1)l,C -> B,length,K*C: the K taps of every output position side by side."""
        l = self.conv.dilation[0]
        return torch.cat([xp[:, k * l : k * l + length] for k in range(self.conv.kernel_size[0])], dim=-1)

    @staticmethod
    def gate(h: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """tanh of the first half of h along ``dim`` times sigmoid of the second."""
        f, s = h.chunk(2, dim=dim)  # n_f each
        return torch.tanh(f) * torch.sigmoid(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x B,L,C_in (padding already zeroed) -> B,L,n_f."""
        if self.runs_conv1d(x):
            return self.forward_channels_first(x.transpose(1, 2)).transpose(1, 2)  # B,L,n_f
        xp = F.pad(x, (0, 0, *self.pad))  # B,L+(K-1)l,C_in, zeros at both ends (or the left)
        return self.gate(F.linear(self.shifts(xp, x.size(1)), self.matrix(), self.conv.bias))

    def runs_conv1d(self, x: torch.Tensor) -> bool:
        """Whether ``forward`` takes ``F.conv1d`` (CUDA by default) rather than im2col."""
        return x.is_cuda if self.use_conv1d is None else self.use_conv1d

    def forward_channels_first(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x B,C_in,L (padding already zeroed) -> B,n_f,L with ``F.conv1d``: the layout the
        convolution wants in and gives out, so a stack of them needs no transposes or copies in
        between; symmetric zero padding goes into the convolution itself. ``weight`` and ``bias``:
        the convolution's own, already cast (:func:`_cast_together`), or None: the module's."""
        weight = self.conv.weight if weight is None else weight
        bias = self.conv.bias if bias is None else bias
        left, right = self.pad
        if left != right:  # causal, or an even kernel: pad first
            x, left = F.pad(x, (left, right)), 0
        if self.fused_gate and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            # training: convolution and gate as one autograd Function, 4 operators fewer forward and
            # backward (casts apart) than autograd through the ops below
            return _GatedConv1d.apply(x, weight, bias, left, self.conv.dilation[0])
        h = F.conv1d(x, weight, bias, padding=left, dilation=self.conv.dilation)  # B,2n_f,L
        return self.gate(h, dim=1)  # B,n_f,L

    def step(self, x: torch.Tensor, history: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal only: x B,1,C_in and the last (K-1)*l inputs -> output B,1,n_f and the new history."""
        if history is None:
            history = x.new_zeros(x.shape[0], self.context, x.shape[2])  # B,(K-1)l,C_in
        window = torch.cat([history, x], dim=1)  # B,(K-1)l+1,C_in
        h = F.linear(self.shifts(window, 1), self.matrix(), self.conv.bias)  # B,1,2n_f
        return self.gate(h), window[:, 1:]  # B,1,n_f


class _GatedConv1d(torch.autograd.Function):
    """``F.conv1d`` and the gate tanh(h_f) ⊙ sigmoid(h_s) of x B,C_in,L -> B,n_f,L, with the backward
    written out: the gate is ``F.glu`` of [tanh(h_f); h_s] (tanh in place on the convolution's own
    output), and its backward one ``glu_backward`` with tanh's derivative applied in place to the
    first half. Autograd through conv1d, chunk, tanh, sigmoid and mul dispatched 10 operators
    (casts apart: 4 forward, 6 backward, the chunk's backward a ``cat``); this dispatches 6, and a
    GPU step at Multi30k's batch sizes is bound by kernel launches (bench/README.md). Under autocast
    it casts as ``F.conv1d`` would (x, weight and bias to the autocast dtype) and returns each
    gradient in its input's dtype, as autograd through those casts did."""

    @staticmethod
    def forward(ctx, x, weight, bias, padding: int, dilation: int):
        xc, wc, bc = x, weight, bias
        if _autocast_on(x):  # what autocast does to F.conv1d's inputs: float64 kept, others to its dtype
            dtype = torch.get_autocast_dtype(x.device.type)
            xc, wc, bc = (t if t.dtype == torch.float64 else t.to(dtype) for t in (x, weight, bias))
        h = F.conv1d(xc, wc, bc, padding=padding, dilation=dilation)  # B,2n_f,L, our own tensor
        n = h.shape[1] // 2
        h.narrow(1, 0, n).tanh_()  # [tanh(h_f); h_s]
        ctx.save_for_backward(xc, wc, h)
        ctx.conv = (padding, dilation)
        ctx.dtypes = (x.dtype, weight.dtype, bias.dtype)
        return F.glu(h, dim=1)  # tanh(h_f) * sigmoid(h_s)

    @staticmethod
    def backward(ctx, dy):
        xc, wc, h = ctx.saved_tensors
        padding, dilation = ctx.conv
        n = h.shape[1] // 2
        dh = torch.ops.aten.glu_backward(dy, h, 1)  # [dy·sigmoid(h_s); dy·tanh(h_f)·sigmoid'(h_s)]
        du = dh.narrow(1, 0, n)
        torch.ops.aten.tanh_backward.grad_input(du, h.narrow(1, 0, n), grad_input=du)  # · (1 - tanh²), in place
        dx, dw, db = torch.ops.aten.convolution_backward(
            dh, xc, wc, [wc.shape[0]], [1], [padding], [dilation], False, [0], 1, list(ctx.needs_input_grad[:3]))
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        return (None if dx is None else dx.to(x_dtype), None if dw is None else dw.to(w_dtype),
                None if db is None else db.to(b_dtype), None, None)


class MultiLayerConv(nn.Module):
    """F_i = BN(g_{n_{i-1}, n_i, l_i}(F_{i-1})), F_0 = x; returns [F_1, ..., F_n]."""

    def __init__(self, d_model: int, cfg: CometConfig, causal: bool) -> None:
        super().__init__()
        if len(cfg.features) != len(cfg.dilations):
            raise ValueError(f"comet.features {cfg.features} and comet.dilations {cfg.dilations} differ in length")
        widths = [d_model] + list(cfg.features)
        self.convs = nn.ModuleList(
            GatedConv(widths[i], widths[i + 1], cfg.kernel_size, cfg.dilations[i], causal) for i in range(len(cfg.features))
        )
        self.batch_norm = cfg.batch_norm and (cfg.decoder_batch_norm or not causal)
        # per-length statistics: the encoder's keyed by its own (source) lengths, the decoder's by
        # the source lengths it is given
        bounds = cfg.decoder_bn_length_bounds if causal else cfg.bn_length_bounds
        self.wants_source_lengths = bool(causal and self.batch_norm and bounds)
        self.norms = nn.ModuleList(
            MaskedBatchNorm(n, length_bounds=bounds) if self.batch_norm else _MaskOnly() for n in cfg.features
        )

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                src_lengths: Optional[torch.Tensor] = None, padding: Optional[SharedPadding] = None,
                weights: Optional[list[torch.Tensor]] = None) -> list[torch.Tensor]:
        """x B,L,D -> [F_1..F_n]; ``src_lengths`` (B) key the decoder's per-length statistics.
        ``padding``: :meth:`shared_padding` of the same x shape, pad_mask and src_lengths, if the
        caller computed it once for several stacks (Transformer.encode: once a forward, not once a unit).
        ``weights``: the convolutions' weight and bias, in turn, already cast (ConvUnit under
        autocast), for the channels-first path; None: each module's own."""
        lengths = src_lengths if self.wants_source_lengths else None
        if self.trains_channels_first(x, pad_mask):
            return self._train_channels_first(x, lengths, weights)
        maps = []
        h = x if pad_mask is None else x.masked_fill(pad_mask.unsqueeze(-1), 0.0)  # B,L,D
        # one pad mask for every norm: what it derives from it computed once, not once a norm
        padding = self.shared_padding(x, pad_mask, src_lengths) if padding is None else padding
        for conv, norm in zip(self.convs, self.norms):
            h = norm(conv(h), pad_mask, padding.lengths, padding.statistics)  # B,L,n_i (zero at padding)
            maps.append(h)
        return maps

    def shared_padding(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                       src_lengths: Optional[torch.Tensor] = None) -> SharedPadding:
        """What this stack's norms derive from the pad mask alone (and the given source lengths),
        for x B,L,..: the same for every stack of one config and mode that sees that pad mask."""
        lengths = src_lengths if self.wants_source_lengths else None
        if pad_mask is None or not self.batch_norm:
            return SharedPadding(None, lengths)
        if self.training:
            return SharedPadding(MaskedBatchNorm.padding_statistics(x, pad_mask, lengths), lengths)
        if lengths is None and self.norms[0].length_bounds:  # per-length running statistics: each row's real length
            lengths = (~pad_mask).sum(dim=1)  # B
        return SharedPadding(None, lengths)

    def trains_channels_first(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor]) -> bool:
        """Whether ``forward`` takes :meth:`_train_channels_first` (training, unpadded, ``F.conv1d``)."""
        return (pad_mask is None and self.training and self.batch_norm and self.convs[0].runs_conv1d(x)
                and x.shape[0] * x.shape[1] > 1)

    def _train_channels_first(self, x: torch.Tensor, lengths: Optional[torch.Tensor] = None,
                              weights: Optional[list[torch.Tensor]] = None) -> list[torch.Tensor]:
        """Training on an unpadded batch with ``F.conv1d`` (the GPU path): the stack runs in the
        convolutions' layout B,C,L from one transpose of x to the maps, and batch norm as PyTorch's
        kernel in the convolution's dtype. The same maps as the B,L,C path; fewer operators a step,
        and a GPU step at Multi30k's batch sizes is bound by kernel launches (bench/README.md)."""
        h = x.transpose(1, 2)  # B,D,L
        maps = []
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            h = conv.forward_channels_first(h, *(weights[2 * i : 2 * i + 2] if weights else ()))  # B,n_i,L
            h = norm.train_channels_first(h, lengths)  # B,n_i,L
            maps.append(h.transpose(1, 2))  # B,L,n_i (a view)
        return maps

    def step(self, x: torch.Tensor, cache: dict, src_lengths: Optional[torch.Tensor] = None) -> tuple[list[torch.Tensor], dict]:
        lengths = src_lengths if self.wants_source_lengths else None
        maps, new_cache = [], {}
        h = x  # B,1,D
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            h, new_cache[f"conv{i}"] = conv.step(h, cache.get(f"conv{i}"))  # B,1,n_i
            h = norm(h, None, lengths)
            maps.append(h)
        return maps, new_cache


class _MaskOnly(nn.Module):
    """Stand-in for batch norm when ``comet.batch_norm`` is false: only zeroes padding."""

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor], lengths: Optional[torch.Tensor] = None,
                padding: Optional[PaddingStatistics] = None) -> torch.Tensor:
        return x if pad_mask is None else x.masked_fill(pad_mask.unsqueeze(-1), 0.0)


def _autocast_on(x: torch.Tensor) -> bool:
    """Whether autocast is on for x's device (False for devices autocast does not know, e.g. meta)."""
    try:
        return torch.is_autocast_enabled(x.device.type)
    except RuntimeError:
        return False


class _CastForTwo(torch.autograd.Function):
    """x cast to another ``dtype`` once, as two outputs for two consumers, each output's gradient
    cast back and the two summed in x's dtype: ``_to_copy`` forward, ``_to_copy`` and ``add_``
    backward, where a cast per consumer dispatched two ``_to_copy`` forward and two and an ``add``
    backward. The same values forward and backward, bit for bit."""

    @staticmethod
    def forward(ctx, x, dtype: torch.dtype):
        assert x.dtype != dtype, "a cast to another dtype: the backward adds into its own copy of a gradient"
        xc = x.to(dtype)
        ctx.x_dtype = x.dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, no zeros
        return xc, xc.view_as(xc)

    @staticmethod
    def backward(ctx, da, db):
        if da is None or db is None:
            d = da if db is None else db
            return (None if d is None else d.to(ctx.x_dtype)), None
        return da.to(ctx.x_dtype).add_(db), None  # the sum in x's dtype, db widened inside the add


def _cast_together(tensors: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """``tensors`` (a unit's parameters) cast to ``dtype`` in one cast of their concatenation, as
    views of it: ``cat`` and ``_to_copy`` forward, ``_to_copy`` and a ``cat`` of the gradients (the
    split's) backward, where a cast each dispatched one ``_to_copy`` per tensor forward and one
    backward (8 of each for a 3-layer unit). A cast rounds element by element, so the values and
    gradients are a cast each's, bit for bit."""
    flat = torch.cat([t if t.dim() == 1 else t.reshape(-1) for t in tensors]).to(dtype)  # the numbers of all of them
    # (a bias is 1-D already: no view of it, forward or backward)
    return [part if t.dim() == 1 else part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


class ConvUnit(nn.Module):
    """The convolution sublayer and its Table 1 variants; B,L,D -> B,L,D.

    conv: y = LeakyReLU(W [F_1..F_n; x] + b)                          (section 3.1)
    ffn1: x' = LN(F' + FFN_2(F')), F' = [F_1..F_n]; y = FFN_1([x'; x]) (section 5.3, FFN-1)
    ffn2: y = FFN_2([F_1..F_n; x])                                     (section 5.3, FFN-2)
    """

    def __init__(self, d_model: int, cfg: CometConfig, dropout: float, causal: bool = False) -> None:
        super().__init__()
        self.convs = MultiLayerConv(d_model, cfg, causal)
        self.kind = cfg.unit
        n_feat = sum(cfg.features)
        if cfg.unit == "ffn1":
            self.inner = FeedForward(n_feat, cfg.ffn1_hidden)
            self.inner_norm = nn.LayerNorm(n_feat)
            self.inner_dropout = Dropout(dropout)
        if cfg.unit == "ffn2":
            self.reduce = FeedForward(n_feat + d_model, cfg.ffn2_hidden, d_out=d_model)
        else:
            self.reduce = nn.Linear(n_feat + d_model, d_model)
        self.slope = cfg.leaky_slope
        # the channels-first path under autocast: x cast once for two (False: once per consumer), and
        # the parameters of the convolutions and the linear in one cast (False: one cast each)
        self.cast_once = True
        self.cast_params_once = True

    @property
    def wants_source_lengths(self) -> bool:
        """The decoder's per-source-length batch norm: Transformer.decode and step pass source lengths."""
        return self.convs.wants_source_lengths

    def combine(self, maps: list[torch.Tensor], x: torch.Tensor, reduce: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
        """The maps and x -> B,L,D. ``reduce``: the conv unit's linear's weight and bias already
        cast (:meth:`forward` under autocast), or None: the module's own."""
        if self.kind == "ffn1":
            feats = torch.cat(maps, dim=-1)  # B,L,n_feat
            maps = [self.inner_norm(feats + self.inner_dropout(self.inner(feats)))]  # B,L,n_feat
        if x.dtype != maps[0].dtype and all(m.dtype == maps[0].dtype for m in maps) and _autocast_on(x):
            # bf16 maps and a float32 x: the linear below would take all of it in bf16 anyway, so round
            # x now (one cast) rather than promote the maps to float32 and cast the concatenation back
            # (one cast a map and one more), with the same values. Reached where forward has not cast x
            # already: comet.batch_norm false (the masking stand-in keeps the convolutions' bf16; in
            # forward and step alike), and ffn1's channels-first path on the CPU (its LayerNorm keeps
            # bf16 there; CUDA's autocast gives float32)
            x = x.to(maps[0].dtype)
        joined = torch.cat([*maps, x], dim=-1)  # B,L,n_feat+D
        if self.kind == "ffn2":
            return self.reduce(joined)  # B,L,D
        return F.leaky_relu(self.reduce(joined) if reduce is None else F.linear(joined, *reduce), self.slope)  # B,L,D

    def shared_padding(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                       src_lengths: Optional[torch.Tensor] = None) -> SharedPadding:
        """:meth:`MultiLayerConv.shared_padding`: Transformer.encode and decode compute it once a
        forward with the first unit, keep it in the stack's ``ForwardContext`` and each unit passes
        it to its ConvUnit's ``forward`` as ``padding``."""
        return self.convs.shared_padding(x, pad_mask, src_lengths)

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor] = None,
                src_lengths: Optional[torch.Tensor] = None, padding: Optional[SharedPadding] = None) -> torch.Tensor:
        x_conv, weights, reduce = x, None, None
        if self.kind != "ffn1" and self.convs.trains_channels_first(x, pad_mask) and _autocast_on(x):
            # the first convolution and the concatenation both take x in autocast's dtype (the maps
            # of this path are in it; ffn1's LayerNorm gives float32): cast it once, not once each
            # (float64 is kept, as autocast keeps it)
            dtype = torch.get_autocast_dtype(x.device.type)
            if self.cast_once and x.dtype not in (dtype, torch.float64):
                x_conv, x = _CastForTwo.apply(x, dtype)
                if self.cast_params_once:
                    weights, reduce = self._parameters_cast(dtype)
        return self.combine(self.convs(x_conv, pad_mask, src_lengths, padding, weights), x, reduce)

    def _parameters_cast(self, dtype: torch.dtype) -> tuple[Optional[list[torch.Tensor]], Optional[list[torch.Tensor]]]:
        """The convolutions' weights and biases, in turn, and the conv unit's linear's (None for
        ffn2's FeedForward), cast to ``dtype`` in one cast (:func:`_cast_together`) where autocast
        cast each for its operator: 2 operators forward and 2 backward a unit, not 8 and 8.
        (None, None) where they are not all float32, the dtype autocast would cast."""
        convs = [p for conv in self.convs.convs for p in (conv.conv.weight, conv.conv.bias)]
        linear = [self.reduce.weight, self.reduce.bias] if self.kind == "conv" else []
        if any(p.dtype != torch.float32 for p in convs + linear):
            return None, None
        cast = _cast_together(convs + linear, dtype)
        return cast[: len(convs)], cast[len(convs):] or None

    def step(self, x: torch.Tensor, cache: dict, src_lengths: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict]:
        maps, cache = self.convs.step(x, cache, src_lengths)
        return self.combine(maps, x), cache  # B,1,D


def build_comet(cfg, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> Transformer:
    """COMET: ConvUnit in every encoder unit; FFN_2 (or, for the variant, a causal ConvUnit) in the decoder."""
    c = cfg.comet

    def decoder_ffn():
        if c.decoder == "temporal_conv":
            return ConvUnit(cfg.d_model, c, cfg.dropout, causal=True)
        return FeedForward(cfg.d_model, cfg.d_ff)

    encoder_ffn = lambda: ConvUnit(cfg.d_model, c, cfg.dropout)  # noqa: E731
    return transformer_from_config(cfg, src_vocab_size, tgt_vocab_size, pad_id, encoder_ffn, decoder_ffn)
