"""Search against hand-set probabilities (a toy Markov model implementing the protocol), and on
the real architectures: beam 1 == greedy, cached greedy == full-prefix greedy, length bounds."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from cometnmt.config import DecodeConfig
from cometnmt.decoding import (beam_search, greedy_search, greedy_search_full_prefix, length_normalise, precision_context,
                               sample_search,
                               search, target_log_probs)
from cometnmt.models.base import Seq2Seq, reorder_nested

from test_models import CASES, make, random_batch, warm_batch_norm

BOS, EOS = 2, 3


class Markov(Seq2Seq):
    """Next-token log-probabilities depend on (sentence, position, previous token) through a fixed table."""

    def __init__(self, n_sent: int, max_len: int, vocab: int, seed: int) -> None:
        super().__init__(pad_id=0)
        g = torch.Generator().manual_seed(seed)
        table = torch.randn(n_sent, max_len + 1, vocab, vocab, generator=g) * 2.0
        table[..., :, 0] = -1e9  # never PAD or BOS or UNK
        table[..., :, 1] = -1e9
        table[..., :, BOS] = -1e9
        self.register_buffer("table", torch.log_softmax(table, dim=-1))

    def encode(self, src, src_pad_mask):
        return {"sent": src[:, 0], "pad_mask": src_pad_mask}

    def init_state(self, memory):
        return {"sent": memory["sent"], "pos": 0}

    def step(self, tokens, state):
        logits = self.table[state["sent"], state["pos"], tokens]  # B,V
        return logits, {**state, "pos": state["pos"] + 1}

    def logprob(self, sent: int, seq: list[int]) -> float:
        total, prev = 0.0, BOS
        for pos, tok in enumerate(seq):
            total += float(self.table[sent, pos, prev, tok])
            prev = tok
        return total


def brute_force(model: Markov, sent: int, limit: int, alpha: float, norm: str = "gnmt") -> tuple[float, list[int]]:
    """Best length-normalised hypothesis over every sequence ending in EOS or at the length bound."""
    best = (-math.inf, [])
    words = [4, 5, 6]
    for n in range(0, limit + 1):
        for body in itertools.product(words + [EOS], repeat=n):
            if EOS in body[:-1]:
                continue
            seq = list(body)
            ends = bool(seq) and seq[-1] == EOS
            if not ends and n != limit:
                continue
            score = float(length_normalise(torch.tensor(model.logprob(sent, seq)), len(seq), alpha, norm))
            best = max(best, (score, [t for t in seq if t != EOS]))
    return best


@pytest.mark.parametrize("alpha,norm", [(0.0, "gnmt"), (1.0, "gnmt"), (1.0, "length"), (0.6, "length")])
def test_wide_beam_finds_the_best_hypothesis(alpha, norm):
    """Under either ranking (decode.length_norm: GNMT's penalty or fairseq's division by the length)."""
    model = Markov(n_sent=3, max_len=6, vocab=7, seed=0)
    src = torch.tensor([[0, 9], [1, 9], [2, 9]])
    mask = torch.zeros_like(src, dtype=torch.bool)
    # max_len_a=0, b=4: at most 4 generated tokens, EOS included.
    results = beam_search(model, src, mask, BOS, EOS, beam_size=64, length_penalty=alpha, nbest=3, max_len_a=0.0, max_len_b=4,
                          length_norm=norm)
    for sent in range(3):
        score, tokens = brute_force(model, sent, 4, alpha, norm)
        assert results[sent][0].tokens == tokens
        assert results[sent][0].score == pytest.approx(score, abs=1e-4)
        assert [h.score for h in results[sent]] == sorted((h.score for h in results[sent]), reverse=True)
    if (alpha, norm) == (1.0, "length"):  # the rankings pick different bests for sentence 1: the test tells them apart
        assert brute_force(model, 1, 4, alpha, "gnmt")[1] != results[1][0].tokens


def test_nbest_keeps_every_hypothesis_that_ends_on_the_last_step():
    """A sentence stops at the step that brings its finished hypotheses to K; when that step ends
    two, both are kept. Only the first was (fairseq's cut at K), so the 2-best list held the empty
    hypothesis, finished at step 1 with -3.10, in place of [4, 5, 5, 5] (-2.25), found and dropped."""
    model = Markov(n_sent=8, max_len=6, vocab=6, seed=4)
    src, mask = torch.arange(8)[:, None], torch.zeros(8, 1, dtype=torch.bool)
    hyps = beam_search(model, src, mask, BOS, EOS, beam_size=2, length_penalty=0.0, nbest=2, max_len_a=0.0, max_len_b=5)[1]
    assert [h.tokens for h in hyps] == [[4, 4, 5, 5], [4, 5, 5, 5]]
    assert [h.score for h in hyps] == pytest.approx([model.logprob(1, h.tokens + [EOS]) for h in hyps], abs=1e-4)
    assert model.logprob(1, [EOS]) < hyps[1].score  # the hypothesis it replaced scores lower


def _counted(model: Markov) -> list[int]:
    """Count the rows ``model.step`` runs (patched on the instance); returns the one-item counter."""
    rows, step = [0], model.step

    def counting(tokens, state):
        rows[0] += tokens.numel()
        return step(tokens, state)

    model.step = counting
    return rows


@pytest.mark.parametrize("alpha,norm", [(0.0, "gnmt"), (0.5, "gnmt"), (1.0, "gnmt"), (1.0, "length")])
@pytest.mark.parametrize("nbest", [1, 2])
def test_a_sentence_stops_once_no_live_hypothesis_can_outscore_its_nbest(monkeypatch, alpha, norm, nbest):
    """The early stop (decoding._settled) leaves every hypothesis and score as the search without it
    (fairseq's rule alone: stop at beam_size finished), in fewer steps. A bound that ignored what live
    hypotheses can still reach (stop at nbest finished) changes the output here, so the comparison
    can fail."""
    import cometnmt.decoding as decoding

    src, mask = torch.arange(40)[:, None], torch.zeros(40, 1, dtype=torch.bool)

    def run(settled) -> tuple[list, int]:
        model = Markov(n_sent=40, max_len=12, vocab=7, seed=5)
        rows = _counted(model)
        monkeypatch.setattr(decoding, "_settled", settled)
        found = beam_search(model, src, mask, BOS, EOS, 4, alpha, nbest, 0.0, 12, norm)
        return [[(h.tokens, h.score) for h in hyps] for hyps in found], rows[0]

    early, early_rows = run(decoding._settled)
    full, full_rows = run(lambda bucket, k, n, reachable: len(bucket) >= k)
    hasty, _ = run(lambda bucket, k, n, reachable: len(bucket) >= n)
    assert early == full
    assert early_rows <= full_rows
    if alpha < 1.0 or nbest == 1:  # at penalty 1 the bound (the best live score at the length bound) is loose
        assert early_rows < full_rows
    assert hasty != full


def test_markov_beam_one_equals_greedy():
    model = Markov(n_sent=4, max_len=10, vocab=7, seed=1)
    src = torch.tensor([[0], [1], [2], [3]])
    mask = torch.zeros_like(src, dtype=torch.bool)
    greedy = greedy_search(model, src, mask, BOS, EOS, 0.0, 8)
    beam = beam_search(model, src, mask, BOS, EOS, 1, 0.0, 1, 0.0, 8)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]


@pytest.fixture(params=sorted(CASES))
def trained_like(request):
    """An untrained model whose output distribution is peaked enough to stop on its own sometimes."""
    model = make(request.param, seed=3)
    warm_batch_norm(model, torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.out_proj.bias[EOS] += 2.0
    return model


def test_beam_one_equals_greedy(trained_like):
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(1))
    greedy = greedy_search(trained_like, src, mask, BOS, EOS, 1.5, 5)
    beam = beam_search(trained_like, src, mask, BOS, EOS, 1, 0.0, 1, 1.5, 5)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]


def test_search_runs_under_bf16_autocast(trained_like):
    """decode.precision bf16 on every architecture: greedy and beam search run with the output layer's
    step's logits in bfloat16 (the products under autocast), and give bounded hypotheses of finite score."""
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(1))
    seen, step = [], trained_like.step

    def recording(tokens, state):
        logits, state = step(tokens, state)
        seen.append(logits.dtype)
        return logits, state

    trained_like.step = recording
    with precision_context(torch.device("cpu"), "bf16"):
        greedy = greedy_search(trained_like.eval(), src, mask, BOS, EOS, 1.5, 5)
        beam = beam_search(trained_like, src, mask, BOS, EOS, 3, 1.0, 2, 1.5, 5)
    assert seen and set(seen) == {torch.bfloat16}
    bound = [int(int(n) * 1.5 + 5) for n in (~mask).sum(1)]
    for i, (g, b) in enumerate(zip(greedy, beam)):
        assert len(g.tokens) <= bound[i] and len(b) == 2 and all(len(h.tokens) <= bound[i] for h in b)
        assert math.isfinite(g.score) and all(math.isfinite(h.score) for h in b)


def test_cached_greedy_equals_full_prefix(trained_like):
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(2))
    cached = greedy_search(trained_like, src, mask, BOS, EOS, 1.5, 5)
    full = greedy_search_full_prefix(trained_like, src, mask, BOS, EOS, 1.5, 5)
    assert [h.tokens for h in cached] == [h.tokens for h in full]
    for a, b in zip(cached, full):
        assert a.score == pytest.approx(b.score, abs=1e-4)


def test_forced_decoding_scores_what_search_found(trained_like):
    """target_log_probs (Translator.log_prob's core) of the hypotheses search found, each ended by
    </s>, is greedy search's score and beam search's with length penalty 0, in one padded batch."""
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(6))
    found = [[h] for h in greedy_search(trained_like, src, mask, BOS, EOS, 1.5, 5)]
    found += beam_search(trained_like, src, mask, BOS, EOS, 4, 0.0, 3, 1.5, 5)
    bound = [int(int(n) * 1.5 + 5) for n in (~mask).sum(1)]
    rows = [(i % 4, h) for i, hyps in enumerate(found) for h in hyps if len(h.tokens) < bound[i % 4]]  # ended by </s>
    assert len(rows) >= 4 and len({len(h.tokens) for _, h in rows}) > 1  # several, of several lengths: padding too
    width = max(len(h.tokens) for _, h in rows) + 1
    tgt_in = torch.tensor([[BOS] + h.tokens + [0] * (width - 1 - len(h.tokens)) for _, h in rows])  # B,T
    tgt_out = torch.tensor([h.tokens + [EOS] + [0] * (width - 1 - len(h.tokens)) for _, h in rows])  # B,T
    index = torch.tensor([i for i, _ in rows])
    forced = target_log_probs(trained_like.eval(), src[index], mask[index], tgt_in, tgt_out, 0)  # B
    assert forced.tolist() == pytest.approx([h.score for _, h in rows], abs=1e-4)


def test_output_length_is_bounded(trained_like):
    with torch.no_grad():
        trained_like.out_proj.bias[EOS] -= 100.0  # never stop by itself
    src, mask = random_batch([4, 1], 23, torch.Generator().manual_seed(3))
    greedy = greedy_search(trained_like, src, mask, BOS, EOS, 2.0, 3)
    assert [len(h.tokens) for h in greedy] == [11, 5]
    beam = beam_search(trained_like, src, mask, BOS, EOS, 3, 1.0, 3, 2.0, 3)
    assert [len(b[0].tokens) for b in beam] == [11, 5]
    assert all(len(b) == 3 for b in beam)
    # data.src_sos_eos: <s> and </s> around each source do not lengthen the bound
    wrapped, wrapped_mask = random_batch([6, 3], 23, torch.Generator().manual_seed(3))
    cfg = DecodeConfig(method="greedy", max_len_a=2.0, max_len_b=3)
    assert [len(h[0].tokens) for h in search(trained_like, wrapped, wrapped_mask, BOS, EOS, cfg, src_specials=2)] == [11, 5]
    beam_cfg = DecodeConfig(method="beam", beam_size=3, nbest=1, max_len_a=2.0, max_len_b=3)
    assert [len(h[0].tokens) for h in search(trained_like, wrapped, wrapped_mask, BOS, EOS, beam_cfg, src_specials=2)] == [11, 5]


def test_a_whole_number_bound_is_not_cut_by_rounding():
    """a * words + b on a whole number as written is that many tokens: in float32, 1.3 * 90 was
    116.99999 (116 tokens for 117), and with data.src_sos_eos search's b less the specials' share
    put 0.9 * 10 + 0 at 8.99999: every search stopped a token short."""
    from cometnmt.decoding import max_lengths

    words = torch.arange(130)[None, :] >= torch.tensor([[90], [10], [20]])  # padding masks of 90, 10 and 20 words
    assert max_lengths(words, 1.3, 0).tolist() == [117, 13, 26]
    model = _peaked("transformer", 3).eval()
    with torch.no_grad():
        model.out_proj.bias[EOS] -= 100.0  # never stop by itself
    wrapped, wrapped_mask = random_batch([12, 7], 23, torch.Generator().manual_seed(3))  # 10 and 5 words, <s> </s>
    for method in ("greedy", "beam", "sample"):
        cfg = DecodeConfig(method=method, beam_size=2, sampling_seed=1, max_len_a=0.9, max_len_b=0)
        found = search(model, wrapped, wrapped_mask, BOS, EOS, cfg, src_specials=2)
        assert [len(h[0].tokens) for h in found] == [9, 4], method  # 0.9 * 10 and int(0.9 * 5)


@pytest.mark.parametrize("name", ["transformer", "comet_temporal", "comet_temporal_bn_length", "transformer_pp"])
def test_grouped_cross_attention_equals_copied_rows(name):
    """Beam search's state keeps one copy of the source side per sentence and lets a sentence's K
    rows attend together; stepping it gives the logits of the plain per-row copy, through
    duplication, reshuffles within sentences and a finished sentence leaving."""
    from cometnmt.models.base import reorder_nested

    model = make(name)
    warm_batch_norm(model, torch.Generator().manual_seed(9))
    model.eval()
    src, mask = random_batch([5, 3, 4], 23, torch.Generator().manual_seed(8))
    state = model.init_state(model.encode(src, mask))
    K = 3
    dup = torch.arange(3).repeat_interleave(K)
    grouped, copied = model.reorder(state, dup), reorder_nested(state, dup)
    assert grouped["group"] == K and grouped["units"][0]["cross_k"].size(0) == 3
    gen = torch.Generator().manual_seed(10)
    shuffle = torch.tensor([1, 0, 0, 5, 3, 4, 8, 8, 6])  # rows stay within their sentence
    drop = torch.tensor([0, 1, 2, 6, 7, 8])  # sentence 2 (rows 3-5) finished
    for index in (shuffle, shuffle, drop, None):
        tokens = torch.randint(4, 19, (copied["units"][0]["cross_k"].size(0),), generator=gen)
        with torch.no_grad():
            want, copied = model.step(tokens, copied)
            got, grouped = model.step(tokens, grouped)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        if index is not None:
            grouped, copied = model.reorder(grouped, index), reorder_nested(copied, index)
    assert grouped["group"] == K and grouped["units"][0]["cross_k"].size(0) == 2


@pytest.mark.parametrize("name", ["transformer", "comet_temporal", "transformer_pp", "convs2s", "rnn_gru_dot"])
def test_output_length_stops_at_the_position_limit(name):
    """A bound of a * source length + b past the model's position tables (model.max_positions)
    is cut there: decoding ends where <s> and the output fill the positions, instead of failing
    on the next one; forced decoding of the output and its </s> fits (logprob, attention). At
    one token more, its </s> had no position: logprob and attention refused search's own output."""
    from cometnmt.config import ModelConfig, from_dict
    from cometnmt.models import build_model

    from test_models import PAD, SMALL, V_SRC, V_TGT

    case = CASES[name]
    sizes = {"convs2s": {**case["convs2s"], "max_positions": 12}} if case["arch"] == "convs2s" else {"max_positions": 12}
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, {**SMALL, **case, **sizes}, "model"), V_SRC, V_TGT, PAD).eval()
    limit = model.position_limit()
    assert limit == (None if case["arch"] == "rnn" else 12)
    with torch.no_grad():
        model.out_proj.bias[EOS] -= 100.0  # never stop by itself
    src, mask = random_batch([6, 3], 23, torch.Generator().manual_seed(3))
    want = [min(n * 2 + 10, (limit or 10**6) - 1) for n in (6, 3)]  # 22 and 16 tokens, or 11 each
    greedy = greedy_search(model, src, mask, BOS, EOS, 2.0, 10)
    assert [len(h.tokens) for h in greedy] == want
    assert [len(b[0].tokens) for b in beam_search(model, src, mask, BOS, EOS, 3, 1.0, 1, 2.0, 10)] == want
    if limit is not None:
        width = max(want) + 1
        tgt_in = torch.tensor([[BOS] + h.tokens + [0] * (width - 1 - len(h.tokens)) for h in greedy])  # B,T
        tgt_out = torch.tensor([h.tokens + [EOS] + [0] * (width - 1 - len(h.tokens)) for h in greedy])  # B,T
        forced = target_log_probs(model, src, mask, tgt_in, tgt_out, 0)  # the outputs, each ended by </s>
        assert torch.isfinite(forced).all() and bool((forced < torch.tensor([h.score for h in greedy])).all())


@torch.no_grad()
def teacher_forced(model, src, mask, i: int, tokens: list[int], a: float, b: float) -> tuple[list[int], torch.Tensor]:
    """Sentence i's hypothesis ``tokens`` with the </s> its search emitted (none when it stopped at
    the length bound a * source length + b), and the model's log-probabilities T,V at each of its
    positions, decoded in one teacher-forced pass (not the search's incremental steps)."""
    limit = int(int((~mask[i]).sum()) * a + b)  # generated tokens, </s> included
    seq = tokens + ([EOS] if len(tokens) < limit else [])  # cut at the bound: no </s>
    row = reorder_nested(model.encode(src, mask), torch.tensor([i]))
    return seq, model.decode(torch.tensor([[BOS] + seq[:-1]]), row)[0].float().log_softmax(-1)  # T,V


def _peaked(name: str, seed: int):
    model = make(name, seed=seed)
    warm_batch_norm(model, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.out_proj.bias[EOS] += 2.0
    return model


@pytest.mark.parametrize("names", [("transformer", "comet_temporal"), ("convs2s", "rnn_gru_additive"), ("comet", "transformer_pp")])
def test_an_ensemble_searches_as_one_model(names):
    """Two architectures as one: its cached search (each member's own cache and reorder) equals
    the full-prefix search over its averaged probabilities, beam 1 equals greedy, the n-best
    scores are the ensemble's teacher-forced log-probabilities, and a model ensembled with
    itself translates as it does alone."""
    from cometnmt.models.ensemble import Ensemble

    ens = Ensemble([_peaked(names[0], 3), _peaked(names[1], 4)]).eval()
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(5))
    cached = greedy_search(ens, src, mask, BOS, EOS, 1.5, 5)
    full = greedy_search_full_prefix(ens, src, mask, BOS, EOS, 1.5, 5)
    assert [h.tokens for h in cached] == [h.tokens for h in full]
    beam1 = beam_search(ens, src, mask, BOS, EOS, 1, 0.0, 1, 1.5, 5)
    assert [h.tokens for h in cached] == [b[0].tokens for b in beam1]
    nbest = beam_search(ens, src, mask, BOS, EOS, 4, 0.0, 3, 1.5, 5)
    for i, hyps in enumerate(nbest):
        for h in hyps:
            seq, lp = teacher_forced(ens, src, mask, i, h.tokens, 1.5, 5)
            assert h.score == pytest.approx(float(lp[torch.arange(len(seq)), seq].sum()), abs=1e-4)  # alpha 0: the sum
    alone = _peaked(names[0], 3).eval()
    twice = Ensemble([alone, alone]).eval()
    assert [b[0].tokens for b in beam_search(twice, src, mask, BOS, EOS, 3, 1.0, 1, 1.5, 5)] == \
           [b[0].tokens for b in beam_search(alone, src, mask, BOS, EOS, 3, 1.0, 1, 1.5, 5)]


# --- sampling --------------------------------------------------------------------------------


def _truncated_softmax(logprobs: list[float], topk: int, topp: float, temperature: float) -> list[float]:
    """The distribution sampling should draw from, computed plainly: softmax(lp / temperature), the
    topk most probable kept (0: all) and renormalised, then the most probable kept until their mass
    reaches topp (the token that crosses it included) and renormalised."""
    weights = [math.exp(x / temperature) for x in logprobs]
    probs = [w / sum(weights) for w in weights]
    order = sorted(range(len(probs)), key=lambda j: -probs[j])[: topk or len(probs)]
    mass = sum(probs[j] for j in order)
    kept, before = [], 0.0
    for j in order:
        if before >= topp:
            break
        kept.append(j)
        before += probs[j] / mass
    total = sum(probs[j] for j in kept)
    return [probs[j] / total if j in kept else 0.0 for j in range(len(probs))]


@pytest.mark.parametrize("topk, topp, temperature", [(0, 1.0, 1.0), (0, 1.0, 0.6), (0, 1.0, 2.5), (3, 1.0, 1.0),
                                                      (0, 0.7, 1.0), (4, 0.8, 1.7)])
def test_first_sampled_tokens_follow_the_truncated_softmax(topk, topp, temperature):
    """Over n samples of one sentence, each token's count of the first position is within 5 binomial
    standard deviations of n * its probability under the temperature, top-k and top-p cut (fixed
    seed: the test cannot flake), and a token the cut removes is never drawn."""
    model = Markov(n_sent=2, max_len=4, vocab=12, seed=0)
    src, mask = torch.tensor([[1]]), torch.zeros(1, 1, dtype=torch.bool)
    n = 6000
    samples = sample_search(model, src, mask, BOS, EOS, 0.0, 1, nbest=n, topk=topk, topp=topp, temperature=temperature,
                            generator=torch.Generator().manual_seed(11))[0]
    counts = torch.bincount(torch.tensor([(h.tokens or [EOS])[0] for h in samples]), minlength=12).tolist()
    want = _truncated_softmax(model.table[1, 0, BOS].tolist(), topk, topp, temperature)
    assert sum(p > 0 for p in want) >= 3  # the case draws among several tokens
    for token, (count, p) in enumerate(zip(counts, want)):
        assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9, (token, count, n * p)


@pytest.mark.parametrize("topp", [1e-30, 1e-50, 1e-300])
def test_a_tiny_topp_keeps_the_most_probable_token(topp):
    """topp as small as the config allows is greedy search: a topp below float32's least number
    (1e-50, 1e-300) compared as 0 and cut every token, so each sample was padding, score -inf (an
    empty translation; "-Infinity" in serve's JSON)."""
    model = Markov(n_sent=2, max_len=5, vocab=9, seed=3)
    src, mask = torch.tensor([[0], [1]]), torch.zeros(2, 1, dtype=torch.bool)
    greedy = greedy_search(model, src, mask, BOS, EOS, 0.0, 5)
    sampled = sample_search(model, src, mask, BOS, EOS, 0.0, 5, nbest=3, topp=topp, generator=torch.Generator().manual_seed(0))
    for g, hyps in zip(greedy, sampled):
        assert [h.tokens for h in hyps] == [g.tokens] * 3 and [h.score for h in hyps] == pytest.approx([g.score] * 3)


def test_markov_samples_are_scored_by_their_own_log_probabilities():
    model = Markov(n_sent=3, max_len=8, vocab=9, seed=5)
    src, mask = torch.tensor([[0], [1], [2]]), torch.zeros(3, 1, dtype=torch.bool)
    results = sample_search(model, src, mask, BOS, EOS, 0.0, 6, nbest=20, temperature=1.5, generator=torch.Generator().manual_seed(2))
    assert [len(r) for r in results] == [20, 20, 20]
    for sent, hyps in enumerate(results):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)  # best first
        for h in hyps:
            seq = h.tokens + ([EOS] if len(h.tokens) < 6 else [])
            assert h.score == pytest.approx(model.logprob(sent, seq), abs=1e-4)  # untempered
        assert len({tuple(h.tokens) for h in hyps}) > 5  # independent samples, not one copied


def test_no_search_emits_padding_or_bos():
    """Padding and <s> made the likeliest tokens: greedy (cached and full-prefix), beam search and
    sampling still never emit them, and their scores stay the model's own log-probabilities."""
    model = _peaked("transformer", 3).eval()
    with torch.no_grad():
        model.out_proj.bias[[0, BOS]] += 6.0
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = model.step(torch.full((4,), BOS), model.init_state(model.encode(src, mask)))[0]  # B,V
    assert set(first.argmax(-1).tolist()) <= {0, BOS}  # an unguarded arg-max would take them
    found = [[h] for h in greedy_search(model, src, mask, BOS, EOS, 1.5, 5)]
    found += [[h] for h in greedy_search_full_prefix(model, src, mask, BOS, EOS, 1.5, 5)]
    found += beam_search(model, src, mask, BOS, EOS, 4, 0.0, 4, 1.5, 5)
    found += sample_search(model, src, mask, BOS, EOS, 1.5, 5, nbest=8, generator=torch.Generator().manual_seed(0))
    assert not any({0, BOS} & set(h.tokens) for hyps in found for h in hyps)
    lp = first.log_softmax(-1)  # B,V
    for i, h in enumerate(found[:4]):
        token = h[0].tokens[0] if h[0].tokens else EOS
        assert h[0].score < float(lp[i, token]) + 1e-4  # the first token's full-distribution log-prob, and more


def test_sampling_that_keeps_only_the_argmax_is_greedy(trained_like):
    """top-k 1, a tiny temperature and a top-p below every top probability each leave one token:
    sampling then is greedy search, tokens and scores, for every sample."""
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(1))
    greedy = greedy_search(trained_like, src, mask, BOS, EOS, 1.5, 5)
    for topk, topp, temperature in [(1, 1.0, 1.0), (0, 1.0, 1e-20), (0, 1e-6, 1.0), (1, 0.5, 3.0)]:
        settings = {"topk": topk, "topp": topp, "temperature": temperature, "generator": torch.Generator().manual_seed(0)}
        one = sample_search(trained_like, src, mask, BOS, EOS, 1.5, 5, nbest=1, **settings)
        assert [r[0].tokens for r in one] == [h.tokens for h in greedy]
        assert [r[0].score for r in one] == [h.score for h in greedy]  # the same steps: the same numbers
        three = sample_search(trained_like, src, mask, BOS, EOS, 1.5, 5, nbest=3, **settings)
        assert [[h.tokens for h in r] for r in three] == [[h.tokens] * 3 for h in greedy]
        for r, h in zip(three, greedy):
            assert [s.score for s in r] == pytest.approx([h.score] * 3, abs=1e-4)


def test_top_k_samples_stay_in_the_k_best_and_score_their_log_probabilities(trained_like):
    """Each sampled token is among the k most probable of its step (padding and <s> aside: never
    drawn), and a sample's score is the sum
    of the model's teacher-forced log-probabilities of its tokens (temperature left out)."""
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(6))
    results = sample_search(trained_like, src, mask, BOS, EOS, 1.5, 5, nbest=4, topk=3, temperature=3.0,
                            generator=torch.Generator().manual_seed(1))
    outside = []
    for i, hyps in enumerate(results):
        assert len(hyps) == 4 and [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            seq, lp = teacher_forced(trained_like, src, mask, i, h.tokens, 1.5, 5)
            assert h.score == pytest.approx(float(lp[torch.arange(len(seq)), seq].sum()), abs=1e-4)
            drawable = lp.index_fill(1, torch.tensor([0, BOS]), float("-inf"))  # T,V: padding and <s> never drawn
            outside += [tok for tok, top in zip(seq, drawable.topk(3, dim=-1).indices.tolist()) if tok not in top]
    assert not outside
    assert any(len({tuple(h.tokens) for h in hyps}) > 1 for hyps in results)  # hot enough to differ


def test_sampling_seeds_and_the_length_bound():
    """One seed, one output; another seed, another; no seed draws from torch's global RNG. The
    length bound (and data.src_sos_eos's specials) is greedy search's."""
    model = _peaked("transformer", 3).eval()
    with torch.no_grad():
        model.out_proj.bias[EOS] -= 2.0
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(4))

    def tokens(**settings):
        cfg = DecodeConfig(method="sample", nbest=3, temperature=2.0, max_len_a=1.5, max_len_b=5, **settings)
        return [[h.tokens for h in r] for r in search(model, src, mask, BOS, EOS, cfg)]

    assert tokens(sampling_seed=7) == tokens(sampling_seed=7)
    assert tokens(sampling_seed=7) != tokens(sampling_seed=8)
    torch.manual_seed(3)
    first = tokens()
    torch.manual_seed(3)
    assert tokens() == first and tokens() != first
    with torch.no_grad():
        model.out_proj.bias[EOS] -= 100.0  # never stop by itself
    wrapped, wrapped_mask = random_batch([6, 3], 23, torch.Generator().manual_seed(3))
    cfg = DecodeConfig(method="sample", nbest=2, sampling_seed=1, max_len_a=2.0, max_len_b=3)
    assert [[len(h.tokens) for h in r] for r in search(model, wrapped, wrapped_mask, BOS, EOS, cfg, src_specials=2)] == \
           [[11, 11], [5, 5]]


@pytest.mark.parametrize("names", [("transformer", "comet_temporal"), ("convs2s", "rnn_gru_additive")])
def test_an_ensemble_samples_as_one_model(names):
    """Samples of an ensemble score its teacher-forced (averaged) log-probabilities, and a model
    ensembled with itself samples as it does alone from the same seed."""
    from cometnmt.models.ensemble import Ensemble

    ens = Ensemble([_peaked(names[0], 3), _peaked(names[1], 4)]).eval()
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(5))
    results = sample_search(ens, src, mask, BOS, EOS, 1.5, 5, nbest=3, topp=0.9, temperature=2.0,
                            generator=torch.Generator().manual_seed(3))
    for i, hyps in enumerate(results):
        for h in hyps:
            seq, lp = teacher_forced(ens, src, mask, i, h.tokens, 1.5, 5)
            assert h.score == pytest.approx(float(lp[torch.arange(len(seq)), seq].sum()), abs=1e-4)
    alone = _peaked(names[0], 3).eval()
    twice = Ensemble([alone, alone]).eval()
    assert [[h.tokens for h in r] for r in sample_search(twice, src, mask, BOS, EOS, 1.5, 5, nbest=3, temperature=2.0,
                                                         generator=torch.Generator().manual_seed(9))] == \
           [[h.tokens for h in r] for r in sample_search(alone, src, mask, BOS, EOS, 1.5, 5, nbest=3, temperature=2.0,
                                                         generator=torch.Generator().manual_seed(9))]


def test_seeded_samples_do_not_depend_on_the_batch(trained_like):
    """A sentence's samples came from one generator shared by its batch, so they changed with the
    sentences batched beside it. Each sentence now draws from its own stream keyed by the seed and
    its key: alone or in a padded batch, the same samples (every architecture, batch norm too);
    another key, another stream; nbest 1's sample is the first of nbest 3's streams."""
    src, mask = random_batch([7, 2, 5, 9], 23, torch.Generator().manual_seed(2))
    settings = {"nbest": 3, "temperature": 2.0, "seed": 17}
    batch = sample_search(trained_like, src, mask, BOS, EOS, 1.5, 5, keys=[10, 11, 12, 13], **settings)
    for i in range(4):
        n = int((~mask[i]).sum())
        alone = sample_search(trained_like, src[i : i + 1, :n], mask[i : i + 1, :n], BOS, EOS, 1.5, 5, keys=[10 + i],
                              **settings)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batch[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batch[i]], abs=1e-4)
    moved = sample_search(trained_like, src, mask, BOS, EOS, 1.5, 5, keys=[13, 12, 11, 10], **settings)
    assert [[h.tokens for h in r] for r in moved] != [[h.tokens for h in r] for r in batch]
    one = sample_search(trained_like, src, mask, BOS, EOS, 1.5, 5, keys=[10, 11, 12, 13], nbest=1, temperature=2.0, seed=17)
    assert all(r[0].tokens in [h.tokens for h in b] for r, b in zip(one, batch))


def test_sample_uniforms_are_keyed_streams():
    """Row i*copies + j holds sentence i's j-th sample's numbers, up to its own bound: equal seeds
    and keys give equal numbers whatever the other rows, the copy count or the longest bound."""
    from cometnmt.decoding import sample_uniforms

    u = sample_uniforms(5, [7, 8], 3, [4, 6])
    assert u.shape == (6, 6) and bool(u[:3, 4:].eq(0).all()) and bool((u[3:] > 0).all() & (u < 1).all())
    assert torch.equal(sample_uniforms(5, [8], 3, [6]), u[3:])
    assert torch.equal(sample_uniforms(5, [8], 1, [6])[0], u[3])  # sample 0 is sample 0 with more copies
    assert torch.equal(sample_uniforms(5, [7], 3, [4]), u[:3, :4])
    assert not torch.equal(sample_uniforms(6, [7], 3, [4]), u[:3, :4]) and not torch.equal(u[0], u[1])
