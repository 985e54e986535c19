"""Greedy search, beam search and sampling, written once against the model protocol (models/base.py).

All are batched over sentences and use the incremental ``step``; sentences that finish leave the
batch (their rows are dropped from the decoder state), so late steps cost only what is still
being decoded. Output length is bounded per sentence by ``max_len_a * source_length + max_len_b``.
None of them emits padding or <s> (:func:`without_specials`).

Greedy decoding is the COMET paper's (section 4.3): start from <s>, append the arg-max token,
stop at </s>; beyond the paper, it never picks padding or <s> and stops at the length bound above
(1.5 x source length + 10 by default: a model that never emits </s> would otherwise run on to
its positions). Beam search keeps ``beam_size`` hypotheses per sentence on tensors, finishes a
hypothesis when it emits </s> among the top ``beam_size`` candidates, ranks finished hypotheses by
log-probability / ((5 + length) / 6) ** length_penalty (Wu et al. 2016; or, with
``decode.length_norm: length``, log-probability / length ** length_penalty, as fairseq), and stops a sentence once
it has ``beam_size`` finished hypotheses or reaches its length bound, or earlier, once no live hypothesis can
still outscore its ``nbest`` best finished ones (which leaves the output as it was). Sampling (as fairseq's
``--sampling``, e.g. for back-translation) decodes like greedy search but draws each token at
random, with optional temperature, top-k and nucleus (top-p) truncation; ``nbest`` samples per
sentence are ``nbest`` copies of its row. Each sentence draws from its own stream of random
numbers, keyed by the seed and the sentence's place in the input (:func:`sample_uniforms`), so
its samples do not depend on the sentences batched with it.
"""

from __future__ import annotations

import hashlib
import heapq
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from cometnmt.models.base import Seq2Seq


PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # train/decode.precision's


def precision_context(device: torch.device, precision: str):
    """The context a model runs in under ``train.precision`` or ``decode.precision``: nothing for
    fp32; for bf16 and fp16, autocast on ``device``'s kind (matrix products and convolutions in the
    16-bit type, reductions, norms and softmax in float32, as PyTorch's autocast lists them). A
    search reads the logits back in float32 (``logits.float()``) before its log-softmax."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=PRECISION_DTYPES[precision])


@dataclass
class Hypothesis:
    tokens: list[int]  # without <s> and </s>
    score: float  # length-normalised log-probability (beam) or plain log-probability (greedy, sample)


def without_specials(lp: torch.Tensor, pad: int, bos: int) -> torch.Tensor:
    """Log-probabilities A,V with padding and <s> set to -inf, in place (``lp`` is a step's own
    fresh tensor; no copy, no index tensor sent to the device): never targets in training, they
    are never chosen (as fairseq never chooses padding). A trained model gives them a tiny but
    nonzero probability, which sampling would surface; an untrained one may prefer them. The other
    tokens keep their full-distribution log-probabilities, so scores equal the teacher-forced ones."""
    lp[:, pad] = float("-inf")
    lp[:, bos] = float("-inf")
    return lp


def max_lengths(src_pad_mask: torch.Tensor, a: float, b: float, cap: Optional[int] = None) -> torch.Tensor:
    """Per-sentence bound on generated tokens (</s> included): B long. ``cap``: the model's
    position limit (``Seq2Seq.position_limit``). An output stops at cap - 1 tokens: then <s> and
    its tokens fill the positions, as the longest training target did, and forced decoding (its
    tokens and a </s>) fits. At cap tokens (the step at position t needs only t < cap), logprob
    and attention refused the search's own output as longer than the model's positions.
    Worked out in float64 and a hair above: a bound a * length + b that is a whole number as
    written can land a rounding error below it in binary (1.3 * 90 is 116.99999 in float32, and
    :func:`search`'s ``b`` less the specials' share, 0.9 * 12 + (0 - 1.8), is 8.99999), which cut a token."""
    src_len = (~src_pad_mask).sum(dim=1)  # B
    # on the host: MPS has no float64 (one small copy per search call)
    bound = torch.floor(src_len.to("cpu", torch.float64) * a + b + 1e-6).long().to(src_len.device)  # B
    return bound.clamp(min=1, max=None if cap is None else max(cap - 1, 1))


@torch.no_grad()
def greedy_search(
    model: Seq2Seq, src: torch.Tensor, src_pad_mask: torch.Tensor, bos: int, eos: int, max_len_a: float, max_len_b: float
) -> list[Hypothesis]:
    """Arg-max decoding with the incremental step. Returns one hypothesis per sentence, in order."""
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.position_limit())  # B
    return _incremental_search(model, src, src_pad_mask, bos, eos, limits, 1, lambda lp, rows, t: lp.argmax(dim=-1))


def _incremental_search(model: Seq2Seq, src: torch.Tensor, src_pad_mask: torch.Tensor, bos: int, eos: int,
                        limits: torch.Tensor, copies: int,
                        choose: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> list[Hypothesis]:
    """One token per row and step, picked by ``choose`` (log-probabilities A,V, the A rows' numbers
    in 0..B*copies-1 and the step -> tokens A), for
    ``copies`` rows per sentence (rows i*copies .. i*copies+copies-1 are sentence i's). The first
    step runs once per sentence; its state is then duplicated. A row stops at </s> or its length
    bound and leaves the batch. Scores are the sums of the model's log-probabilities of the tokens
    (</s> included); padding and <s> are never chosen (:func:`without_specials`). ``limits``: each
    sentence's length bound (:func:`max_lengths`), B. Returns B*copies hypotheses, in row order."""
    B = src.size(0)
    limits = limits.repeat_interleave(copies)  # B*N
    state = model.init_state(model.encode(src, src_pad_mask))
    out = torch.full((B * copies, int(limits.max())), eos, dtype=torch.long, device=src.device)  # B*N,Tmax
    logprob = torch.zeros(B * copies, device=src.device)  # B*N
    active = torch.arange(B * copies, device=src.device)  # rows still decoding
    tokens = torch.full((B,), bos, dtype=torch.long, device=src.device)  # B: the first step, once per sentence
    for t in range(out.size(1)):
        logits, state = model.step(tokens, state)  # A,V
        lp = F.log_softmax(logits.float(), dim=-1)  # A,V
        if t == 0 and copies > 1:
            rows = torch.arange(B, device=src.device).repeat_interleave(copies)  # B*N
            lp, state = lp.index_select(0, rows), model.reorder(state, rows)  # B*N,V
        tokens = choose(without_specials(lp, model.pad_id, bos), active, t)  # A
        out[active, t] = tokens
        logprob[active] += lp.gather(1, tokens[:, None]).squeeze(1)  # A
        done = tokens.eq(eos) | limits[active].le(t + 1)  # A
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # A'
            active, tokens = active[keep], tokens[keep]
            state = model.reorder(state, keep)
    return [Hypothesis(_strip(row, eos), float(s)) for row, s in zip(out.tolist(), logprob.tolist())]


@torch.no_grad()
def sample_search(model: Seq2Seq, src: torch.Tensor, src_pad_mask: torch.Tensor, bos: int, eos: int, max_len_a: float,
                  max_len_b: float, nbest: int = 1, topk: int = 0, topp: float = 1.0, temperature: float = 1.0,
                  generator: Optional[torch.Generator] = None, *, seed: Optional[int] = None,
                  keys: Optional[Sequence[int]] = None) -> list[list[Hypothesis]]:
    """``nbest`` independent samples per sentence, highest score first: each step draws a token
    from the model's distribution with its logits divided by ``temperature``, cut to the ``topk``
    most probable tokens (0: all), then to the nucleus of probability ``topp`` (1.0: off).

    A sample's score is the sum of the model's own log-probabilities of its tokens, before
    temperature and truncation (as greedy search's), so the scores of greedy and sampled
    translations compare. Random numbers: sentence i's come from its own stream, keyed by
    ``seed`` and ``keys[i]`` (default i; a caller passes each sentence's place in its input), so
    a sentence's samples depend on neither the sentences batched with it nor the batch size, nor
    the device (the streams are drawn on the CPU). Without ``seed`` one is drawn from
    ``generator`` (None: torch's global RNG). Padding and <s> are never drawn
    (:func:`without_specials`), so a search that keeps one token a step (``topk`` 1, say) is
    greedy search."""
    if seed is None:
        seed = _draw_seed(generator)
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.position_limit())  # B
    uniforms = sample_uniforms(seed, range(src.size(0)) if keys is None else keys, nbest, limits.tolist())
    uniforms = uniforms.to(src.device)  # B*nbest,Tmax

    def choose(lp: torch.Tensor, rows: torch.Tensor, t: int) -> torch.Tensor:
        return sample_tokens(lp, topk, topp, temperature, uniforms[rows, t])

    hyps = _incremental_search(model, src, src_pad_mask, bos, eos, limits, nbest, choose)
    return [sorted(hyps[i : i + nbest], key=lambda h: -h.score) for i in range(0, len(hyps), nbest)]


SEED_SPAN = 2**63 - 1  # seeds drawn for a call without one: [0, 2**63 - 1), as decode.sampling_seed's range


def sample_uniforms(seed: int, keys: Sequence[int], copies: int, limits: Sequence[int]) -> torch.Tensor:
    """The random numbers of sampling: row i*copies + j (sentence i's j-th sample) holds, for each
    step up to its bound ``limits[i]``, a uniform number in [0, 1) from a CPU generator seeded
    with a hash of (``seed``, ``keys[i]``). A sentence's numbers therefore depend only on the seed,
    its key and its own length bound, and sample j's on neither ``copies`` nor the other rows
    (one stream per sentence, read sample by sample). Returns B*copies, max(limits) float64."""
    out = torch.zeros(len(keys) * copies, max(limits, default=1), dtype=torch.float64)
    for i, (key, limit) in enumerate(zip(keys, limits)):
        digest = hashlib.blake2b(f"cometnmt sample {seed} {key}".encode(), digest_size=8).digest()
        stream = torch.Generator().manual_seed(int.from_bytes(digest, "little") & SEED_SPAN)
        out[i * copies : (i + 1) * copies, :limit] = torch.rand(copies, limit, generator=stream, dtype=torch.float64)
    return out


def sample_tokens(lp: torch.Tensor, topk: int, topp: float, temperature: float, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of log-probabilities A,V, drawn from softmax(lp / temperature) cut to the
    ``topk`` most probable tokens (0: all), then to the fewest of those whose renormalised
    probability reaches ``topp`` (the token that crosses it is kept, so the most probable token
    always survives). Drawn by inversion: row a takes the first token whose cumulative
    probability exceeds ``uniforms[a]`` (A, in [0, 1)) times the row's total, so one number a row
    and step decides it whatever else is in the batch. Returns A long."""
    scaled = (lp - lp.amax(dim=-1, keepdim=True)) / temperature  # A,V; max 0, so a tiny temperature (>= 1e-30, config check) cannot overflow
    V = lp.size(-1)
    k = V if topk == 0 else min(topk, V)
    if k == V and topp >= 1.0:
        return _invert(scaled.softmax(dim=-1), uniforms)  # A
    top, index = scaled.topk(k, dim=-1)  # A,k, most probable first
    probs = top.softmax(dim=-1)  # A,k
    if topp < 1.0:
        outside = probs.cumsum(dim=-1) - probs >= topp  # A,k: mass before a token reached topp
        # the most probable token always survives: a topp below float32's least number (1.4e-45, which the
        # config allows) compared as 0 and removed every token, so padding was drawn, score -inf
        outside[:, 0] = False
        probs = probs.masked_fill(outside, 0.0)
    return index.gather(1, _invert(probs, uniforms)[:, None]).squeeze(1)  # A


def _invert(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one index per row of A,n probabilities (zeros allowed, never drawn)."""
    cdf = probs.double().cumsum(dim=-1)  # A,n; float64, so rounding shifts a boundary by ~1e-16
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)  # A,1: below the row's total
    pick = torch.searchsorted(cdf, target, right=True).squeeze(1)  # A: first index whose cdf exceeds it
    last = probs.size(1) - 1 - probs.gt(0).flip(1).long().argmax(dim=1)  # A: the last drawable index
    return torch.minimum(pick, last)  # rounding at the top end must not land on a zero-probability tail


@torch.no_grad()
def greedy_search_full_prefix(
    model: Seq2Seq, src: torch.Tensor, src_pad_mask: torch.Tensor, bos: int, eos: int, max_len_a: float, max_len_b: float
) -> list[Hypothesis]:
    """Greedy decoding that re-decodes the whole prefix at every step (no cache): the paper's
    description taken literally. Kept as the reference the benchmark compares the incremental
    step against; results equal :func:`greedy_search`."""
    B = src.size(0)
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.position_limit())  # B
    memory = model.encode(src, src_pad_mask)
    prefix = torch.full((B, 1), bos, dtype=torch.long, device=src.device)  # B,1
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)  # B
    logprob = torch.zeros(B, device=src.device)
    for t in range(int(limits.max())):
        lp = F.log_softmax(model.decode(prefix, memory)[:, -1].float(), dim=-1)  # B,V
        best, tokens = without_specials(lp, model.pad_id, bos).max(dim=-1)  # B
        tokens = tokens.masked_fill(finished, eos)
        logprob += best.masked_fill(finished, 0.0)
        prefix = torch.cat([prefix, tokens[:, None]], dim=1)  # B,t+2
        finished |= tokens.eq(eos) | limits.le(t + 1)
        if bool(finished.all()):
            break
    return [Hypothesis(_strip(row[1:], eos), float(s)) for row, s in zip(prefix.tolist(), logprob.tolist())]


def _strip(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos)] if eos in row else row


def length_normalise(score: torch.Tensor, length: int | torch.Tensor, alpha: float, norm: str = "gnmt") -> torch.Tensor:
    """A finished hypothesis's score for ranking (``decode.length_norm``): "gnmt", GNMT's length
    penalty score / ((5 + length) / 6) ** alpha (Wu et al. 2016); "length", score / length ** alpha,
    fairseq's ``--lenpen`` (ConvS2S's length normalisation, Gehring et al. 2017, section 5)."""
    if alpha == 0.0:
        return score
    if norm == "length":
        return score / length ** alpha
    return score / ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_pad_mask: torch.Tensor,
    bos: int,
    eos: int,
    beam_size: int,
    length_penalty: float,
    nbest: int,
    max_len_a: float,
    max_len_b: float,
    length_norm: str = "gnmt",
) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``nbest`` best hypotheses per sentence, best first, ranked
    by :func:`length_normalise` (``length_norm``, with ``length_penalty`` its alpha).

    A sentence leaves the batch once it has ``beam_size`` finished hypotheses (as fairseq does):
    with a length penalty a live hypothesis could still have ended above them, so this is the
    usual approximation, not an exact search for the best-scoring finished hypothesis.
    It leaves earlier where going on cannot change its ``nbest`` best (:func:`_settled`): the
    hypotheses it would have finished later all rank below them, so the output is the same, in
    fewer steps (as Hugging Face's ``early_stopping="never"`` bound). On test_2016_flickr with a
    trained Transformer that saves 12% of the rows decoded at length penalty 0, 3% at 0.5, 0.6% at
    1 (bench/README.md)."""
    B, K, device = src.size(0), beam_size, src.device
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.position_limit())  # B
    state = model.init_state(model.encode(src, src_pad_mask))
    # The first step has one live hypothesis per sentence: it runs on B rows (not B*K identical
    # ones), and the rows are then duplicated K-fold by the first reorder below.
    scores = torch.zeros(B, 1, device=device)  # n,k cumulative log-probs (k = 1 at t = 0, then K)
    seqs = torch.empty(B, 0, dtype=torch.long, device=device)  # n*k,t
    tokens = torch.full((B,), bos, dtype=torch.long, device=device)  # n*k
    active = torch.arange(B, device=device)  # sentence id of each block of k rows
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for t in range(int(limits.max())):
        n, k = scores.shape
        logits, state = model.step(tokens, state)  # n*k,V
        lp = without_specials(F.log_softmax(logits.float(), dim=-1), model.pad_id, bos)  # n*k,V
        top_scores, src_beam, top_tok = _top_candidates(lp, scores, 2 * K)  # n,2K each
        is_eos = top_tok.eq(eos)  # n,2K
        _collect_eos(finished, active, is_eos[:, :K], top_scores[:, :K], src_beam[:, :K], seqs, k, t, length_penalty,
                     length_norm)
        alive_scores, pick = top_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)  # n,K
        rows = (torch.arange(n, device=device)[:, None] * k + src_beam.gather(1, pick)).view(-1)  # n*K: rows of the step's input
        tokens = top_tok.gather(1, pick).view(-1)  # n*K
        seqs = torch.cat([seqs.index_select(0, rows), tokens[:, None]], dim=1)  # n*K,t+1
        scores = alive_scores
        at_limit = limits[active].le(t + 1)  # n
        for i in at_limit.nonzero().squeeze(1).tolist():  # sentences out of length: keep their beams
            _finish_rows(finished[int(active[i])], scores[i], seqs[i * K : (i + 1) * K], length_penalty, length_norm)
        reachable = length_normalise(scores[:, 0], limits[active], length_penalty, length_norm).tolist()  # n
        enough = torch.tensor([_settled(finished[s], K, nbest, r) for s, r in zip(active.tolist(), reachable)],
                              device=device)
        done = at_limit | enough  # n
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # n'
            block = (keep[:, None] * K + torch.arange(K, device=device)).view(-1)  # n'*K
            rows, tokens, seqs = rows.index_select(0, block), tokens.index_select(0, block), seqs.index_select(0, block)
            active, scores = active[keep], scores[keep]
        state = model.reorder(state, rows)
    results = []
    for hyps in finished:
        hyps.sort(key=lambda h: -h[0])
        results.append([Hypothesis(toks, score) for score, toks in hyps[:nbest]])
    return results


def _settled(bucket: list, beam_size: int, nbest: int, reachable: float) -> bool:
    """Whether a sentence's beam search is over, given its finished hypotheses ``bucket`` ((score,
    tokens), ranked by score): it has ``beam_size`` of them (fairseq's rule), or its ``nbest`` best
    already score at least ``reachable``, the best score any of its live hypotheses can still end
    with. A live hypothesis's log-probability only falls as it grows, and the length penalty
    divides a negative score by at most its value at the length bound, so ``reachable`` is the best
    live score normalised at the sentence's length bound (with no length penalty, the best live
    score). A hypothesis finished later then ranks below the ``nbest`` (a tie too: the ranking
    sort is stable, earlier first), so stopping leaves the output unchanged. The bound is loosened
    by a relative 1e-5, for the float32 rounding of the scores compared."""
    if len(bucket) >= beam_size:
        return True
    if len(bucket) < nbest:
        return False
    if reachable == float("-inf"):  # no live hypothesis left
        return True
    nth = heapq.nlargest(nbest, (score for score, _ in bucket))[-1]
    return nth >= reachable + 1e-5 * abs(reachable)


def _top_candidates(lp: torch.Tensor, scores: torch.Tensor, m: int) -> tuple[torch.Tensor, ...]:
    """The m best continuations per sentence over its k beams: log-probabilities n*k,V and
    cumulative scores n,k -> their scores, beam (0..k-1) and token, n,m each, best first.

    Continuation (beam j, token w) scores scores[j] + lp[j, w]. The m best of a
    sentence are among the m best tokens of each of its beams (a beam's score is shared by its
    tokens), so the beam scores are added to k*m candidates per sentence, not to an n*k x V matrix,
    and the final top-m runs over k*m values, not k*V (bench/README.md has the measured effect)."""
    n, k = scores.shape
    per_row = min(m, lp.size(-1))
    top_lp, top_tok = lp.topk(per_row, dim=-1)  # n*k,per_row
    cand = (top_lp + scores.view(-1, 1)).view(n, k * per_row)  # n,k*per_row
    if k * per_row < m:  # tiny vocabulary, first step: fill up with impossible candidates
        cand = F.pad(cand, (0, m - k * per_row), value=float("-inf"))
    best, flat = cand.topk(m, dim=1)  # n,m
    flat = flat.clamp(max=k * per_row - 1)  # a filler slot reads a real candidate; its score stays -inf
    return best, flat // per_row, top_tok.reshape(n, -1).gather(1, flat)


def _collect_eos(finished, active, eos_mask, scores, src_beam, seqs, k, t, alpha, norm) -> None:
    """Store hypotheses that end with </s> among the top K candidates (few per step); a sentence's
    beams are rows i*k .. i*k+k-1 of ``seqs``. All of a step's are kept, even past K: the step that
    fills a sentence's K ends its search, and one left out (fairseq keeps the first K) could
    outscore a hypothesis finished earlier, which the n-best list then held in its place."""
    for i, j in eos_mask.nonzero().tolist():
        if scores[i, j].item() == float("-inf"):
            continue
        sent = int(active[i])
        row = i * k + int(src_beam[i, j])
        finished[sent].append((float(length_normalise(scores[i, j], t + 1, alpha, norm)), seqs[row].tolist()))


def _finish_rows(bucket, scores, seqs, alpha, norm) -> None:
    """A sentence hit its length bound: its live beams become finished hypotheses."""
    for score, row in zip(scores.tolist(), seqs.tolist()):
        if score != float("-inf"):
            bucket.append((float(length_normalise(torch.tensor(score), len(row), alpha, norm)), row))


def sampling_seed(cfg) -> Optional[int]:
    """The seed of one sampling call: ``cfg.sampling_seed``, else one drawn from torch's global RNG
    (so ``torch.manual_seed`` repeats a call too); None for another search."""
    if cfg.method != "sample":
        return None
    return cfg.sampling_seed if cfg.sampling_seed is not None else _draw_seed()


def _draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """A seed in [0, SEED_SPAN) from ``generator`` (None: torch's global RNG)."""
    return int(torch.randint(0, SEED_SPAN, (1,), generator=generator, device=getattr(generator, "device", "cpu")))


def search(model: Seq2Seq, src: torch.Tensor, src_pad_mask: torch.Tensor, bos: int, eos: int, cfg,
           src_specials: int = 0, seed: Optional[int] = None,
           keys: Optional[Sequence[int]] = None) -> list[list[Hypothesis]]:
    """Dispatch on a DecodeConfig: greedy (one hypothesis each), beam or sample (``cfg.nbest`` each).
    ``src_specials``: tokens each source carries besides its words (2 for the <s> </s> of
    ``data.src_sos_eos``), left out of the length bound ``max_len_a * words + max_len_b``.
    Sampling: ``seed`` (None: :func:`sampling_seed`'s) and each sentence's ``keys`` (its place in
    the caller's input; None: its row) choose its random numbers (:func:`sample_uniforms`), so a
    caller that batches an input passes one seed for all its batches."""
    a, b = cfg.max_len_a, cfg.max_len_b - src_specials * cfg.max_len_a
    if cfg.method == "greedy":
        return [[h] for h in greedy_search(model, src, src_pad_mask, bos, eos, a, b)]
    if cfg.method == "sample":
        return sample_search(model, src, src_pad_mask, bos, eos, a, b, cfg.nbest, cfg.sampling_topk, cfg.sampling_topp,
                             cfg.temperature, seed=sampling_seed(cfg) if seed is None else seed, keys=keys)
    return beam_search(model, src, src_pad_mask, bos, eos, cfg.beam_size, cfg.length_penalty, cfg.nbest, a, b,
                       cfg.length_norm)


@torch.no_grad()
def target_log_probs(model: Seq2Seq, src: torch.Tensor, src_pad_mask: torch.Tensor, tgt_in: torch.Tensor,
                     tgt_out: torch.Tensor, pad: int) -> torch.Tensor:
    """Forced decoding: the model's log-probability of each given target, teacher-forced (``tgt_in``
    = <s> + target, ``tgt_out`` = target + </s>, padded with ``pad``), summed over the target's
    tokens and its </s>: B. For a hypothesis that ends in </s> this is greedy search's score, and
    beam search's with length penalty 0."""
    logits = model.decode(tgt_in, model.encode(src, src_pad_mask))  # B,T,V
    logp = logits.float().log_softmax(-1).gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # B,T
    return logp.masked_fill(tgt_out.eq(pad), 0.0).sum(-1)  # B
