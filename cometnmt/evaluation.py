"""Translation quality metrics: sacreBLEU scores, the COMET paper's sentence BLEU, significance.

Two families of scores are reported side by side, because they are not comparable:

* **Corpus BLEU and chrF** from sacreBLEU (Post, 2018, "A Call for Clarity in Reporting BLEU
  Scores"), computed on detokenised text with sacreBLEU's defaults (cased, ``13a`` tokeniser,
  ``exp`` smoothing) and reported with their signatures, so that numbers can be reproduced.
* **The COMET paper's metric** (:data:`PAPER_BLEU_LABEL`): the *average of sentence-level*
  BLEU-4 scores on tokenised text, smoothed by adding 1 to both numerator and denominator as the
  paper says, citing Lin and Och's ACL 2004 paper (reference [15]); we take the definition of
  their "ORANGE" paper (COLING 2004: orders n >= 2), i.e. today's NLTK
  ``SmoothingFunction().method2`` (:func:`paper_sentence_bleu` says why, and what it costs). Its Figure 4 plots this metric against source length, which
  :func:`bleu_by_length` reproduces. Its tokens are spaCy's words with a translation's ``<unk>``
  as one word (``cometnmt.data.tokenizers.metric_tokenizer``), as in the model's own output.

Significance is estimated with paired bootstrap resampling (Koehn, 2004, "Statistical
Significance Tests for Machine Translation Evaluation", EMNLP 2004).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from cometnmt.errors import ConfigError, DataError, a_type, setting

logger = logging.getLogger(__name__)

PAPER_BLEU_LABEL = "avg sentence BLEU (Lin-Och add-1, tokenised; COMET paper metric)"

#: BLEU-4, as in Papineni et al. (2002) and the COMET paper.
_MAX_ORDER = 4

Tokenizer = Callable[[str], list[str]]


def paper_label(lowercase: bool = False) -> str:
    """The paper metric's label, saying when it was computed on lowercased text."""
    return PAPER_BLEU_LABEL + (", lowercased" if lowercase else "")


def _lowercased(tokenize: Tokenizer) -> Tokenizer:
    return lambda text: tokenize(text.lower())


# --------------------------------------------------------------------------------------------
# sacreBLEU corpus scores
# --------------------------------------------------------------------------------------------


_BLEU_FALLBACK_WARNED: set[str] = set()  # languages whose tokeniser fallback was warned of once


def bleu_metric(lowercase: bool = False, lang: str | None = None) -> BLEU:
    """sacreBLEU's BLEU with the tokeniser it chooses for the target language ``lang``, as
    ``sacrebleu -l SRC-TGT`` does: ``13a`` for most languages, ``zh`` for Chinese, ``ja-mecab`` and
    ``ko-mecab`` for Japanese and Korean (the signature's ``tok:``). ``13a`` alone read a sentence of
    text written without spaces as a word or two: a Chinese translation one character off its
    reference scored BLEU 0. Where the language's tokeniser needs a package not installed
    (``sacrebleu[ja]``, ``sacrebleu[ko]``) it is ``13a``, with a warning, once per language."""
    if lang is None:
        return BLEU(lowercase=lowercase)
    try:
        return BLEU(lowercase=lowercase, trg_lang=lang)
    except RuntimeError as exc:  # sacreBLEU: "... tokenization requires extra dependencies ..."
        if lang not in _BLEU_FALLBACK_WARNED:
            _BLEU_FALLBACK_WARNED.add(lang)
            logger.warning("BLEU for %r is computed with sacreBLEU's 13a tokeniser, not the one it uses for that "
                           "language: %s", lang, " ".join(str(exc).split()))
        return BLEU(lowercase=lowercase)


def corpus_scores(hyps: list[str], refs: list[str], lowercase: bool = False, lang: str | None = None) -> dict:
    """Corpus BLEU and chrF with sacreBLEU's default settings, plus their signatures.

    Post (2018), "A Call for Clarity in Reporting BLEU Scores": scores are computed on
    detokenised text by sacreBLEU's own tokeniser (``13a``, cased) so that they are comparable
    across papers; chrF is Popović (2015), "chrF: character n-gram F-score for automatic MT
    evaluation".

    :param hyps: detokenised system outputs, one per segment.
    :param refs: detokenised references, aligned with ``hyps``.
    :param lowercase: compare lowercased text (for models trained with ``data.lowercase``); the
        signatures then say ``case:lc``.
    :param lang: the references' language: BLEU tokenises as sacreBLEU does for it
        (:func:`bleu_metric`; None: ``13a``). chrF reads characters in any language.
    :return: ``{"bleu", "bleu_signature", "chrf", "chrf_signature"}``.
    """
    bleu, chrf = bleu_metric(lowercase, lang), CHRF(lowercase=lowercase)
    bleu_score = bleu.corpus_score(hyps, [refs])
    chrf_score = chrf.corpus_score(hyps, [refs])
    return {
        "bleu": float(bleu_score.score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": float(chrf_score.score),
        "chrf_signature": str(chrf.get_signature()),
    }


# --------------------------------------------------------------------------------------------
# The COMET paper's metric: sentence BLEU with Lin-Och add-one smoothing
# --------------------------------------------------------------------------------------------


def _ngram_counts(tokens: Sequence[str], n: int) -> Counter:
    """Counts of the ``n``-grams of ``tokens`` (empty when the sequence is shorter than ``n``)."""
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _brevity_penalty(hyp_len: int, ref_len: int) -> float:
    """BLEU's brevity penalty (Papineni et al., 2002): ``exp(1 - r/c)`` when ``c <= r``."""
    if hyp_len > ref_len:
        return 1.0
    if hyp_len == 0:
        return 0.0
    return math.exp(1.0 - ref_len / hyp_len)


def paper_sentence_bleu(hyp_tokens: list[str], ref_tokens: list[str]) -> float:
    """Sentence BLEU-4 with Lin and Och (2004) add-one smoothing, on a 0..100 scale.

    The modified n-gram precision ``p_n = m_n / t_n`` (clipped matches over hypothesis n-grams,
    Papineni et al., 2002) is smoothed for ``n >= 2`` as ``(m_n + 1) / (t_n + 1)``, "adding 1 to
    both numerator and denominator" (Lin and Och, 2004); ``p_1`` is left unsmoothed. The score
    is ``BP * exp(mean_n log p_n)``; it is 0 when no unigram matches.

    This reproduces NLTK's ``sentence_bleu(..., smoothing_function=SmoothingFunction().method2)``
    exactly, including NLTK's convention that an n-gram order the hypothesis is too short to
    have counts ``t_n = 1`` (so it smooths to ``1/2``, not ``1/1``). Because of that convention a
    hypothesis identical to its reference scores 100 only when it has at least 4 tokens, and
    sacreBLEU's ``add-k`` smoothing (which gives ``1/1`` there) is *not* the same metric.

    Unsmoothed ``p_1`` is a choice the paper leaves open. Its reference [15] is Lin and Och's ACL
    2004 paper, the one NLTK's method2 cited until NLTK 3.6 (2021), and until then method2 added 1
    to every order, unigrams included (nltk/nltk#2571); the paper's "adds 1 to both the numerator
    and denominator" does not exclude ``p_1``. We follow Lin and Och's definition (ORANGE, n >= 2)
    and today's NLTK. Smoothing ``p_1`` too scores about 0.2-0.35 points higher at Multi30k's
    levels (measured on perturbed references): the size of the paper's COMET-Transformer gap.

    :param hyp_tokens: tokenised hypothesis.
    :param ref_tokens: tokenised reference.
    :return: the score in ``[0, 100]``.
    """
    log_sum = []
    for n in range(1, _MAX_ORDER + 1):
        hyp_ngrams = _ngram_counts(hyp_tokens, n)
        ref_ngrams = _ngram_counts(ref_tokens, n)
        matches = sum(min(c, ref_ngrams[g]) for g, c in hyp_ngrams.items())
        total = max(1, sum(hyp_ngrams.values()))
        if n == 1:
            if matches == 0:
                return 0.0
        else:
            matches, total = matches + 1, total + 1
        log_sum.append(math.log(matches / total) / _MAX_ORDER)
    bp = _brevity_penalty(len(hyp_tokens), len(ref_tokens))
    return 100.0 * bp * math.exp(math.fsum(log_sum))


def _sentence_scores(hyps: Sequence[str], refs: Sequence[str], tokenize: Tokenizer) -> np.ndarray:
    """:func:`paper_sentence_bleu` of every (hypothesis, reference) pair, tokenised by ``tokenize``."""
    return np.array(
        [paper_sentence_bleu(tokenize(h), tokenize(r)) for h, r in zip(hyps, refs)],
        dtype=np.float64,
    )


def paper_bleu(hyps: list[str], refs: list[str], tokenize: Tokenizer) -> float:
    """The COMET paper's corpus metric: the mean of :func:`paper_sentence_bleu` over the set.

    :param hyps: system outputs (untokenised; ``tokenize`` is applied to each).
    :param refs: references aligned with ``hyps``.
    :param tokenize: the tokeniser of the target language (e.g. spaCy's).
    :return: the average sentence BLEU, 0..100 (0 for an empty set).
    """
    _check_aligned(hyps, refs)
    if not hyps:
        return 0.0
    return float(_sentence_scores(hyps, refs, tokenize).mean())


BY_LENGTH_MIN_COUNT = 3  # bleu_by_length's default: fewer sentences of a length are too noisy to plot


def bleu_by_length(
    src_lengths: list[int],
    hyps_tokens: list[list[str]],
    refs_tokens: list[list[str]],
    min_count: int = BY_LENGTH_MIN_COUNT,
) -> list[dict]:
    """Mean sentence BLEU per source length, as in the COMET paper's Figure 4.

    :param src_lengths: number of source tokens of every sentence.
    :param hyps_tokens: tokenised hypotheses.
    :param refs_tokens: tokenised references.
    :param min_count: lengths with fewer sentences than this are dropped (too noisy to plot).
    :return: rows ``{"length", "count", "paper_bleu"}`` sorted by length.
    """
    if not len(src_lengths) == len(hyps_tokens) == len(refs_tokens):
        raise DataError(
            f"bleu_by_length: got {len(src_lengths)} source lengths, {len(hyps_tokens)} "
            f"hypotheses and {len(refs_tokens)} references; they must be aligned"
        )
    buckets: dict[int, list[float]] = defaultdict(list)
    for length, hyp, ref in zip(src_lengths, hyps_tokens, refs_tokens):
        buckets[int(length)].append(paper_sentence_bleu(hyp, ref))
    rows = [
        {"length": length, "count": len(scores), "paper_bleu": float(np.mean(scores))}
        for length, scores in sorted(buckets.items())
        if len(scores) >= min_count
    ]
    logger.debug("bleu_by_length: %d of %d lengths kept (min_count=%d)",
                 len(rows), len(buckets), min_count)
    return rows


# --------------------------------------------------------------------------------------------
# Paired bootstrap resampling
# --------------------------------------------------------------------------------------------


def _bleu_stats(metric: BLEU, hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """Per-segment BLEU sufficient statistics, shape ``(n, 2 + 2 * max_order)``.

    Rows are ``[hyp_len, ref_len, correct_1..4, total_1..4]`` as produced by sacreBLEU's
    ``Metric._extract_corpus_statistics``, the same path sacreBLEU's own significance tests use.
    """
    return np.asarray(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype=np.int64)


def _bleu_from_stats(metric: BLEU, stats: np.ndarray) -> float:
    """Corpus BLEU from summed sufficient statistics, with ``metric``'s smoothing settings."""
    k = metric.max_ngram_order
    return float(BLEU.compute_bleu(
        correct=[int(x) for x in stats[2 : 2 + k]],
        total=[int(x) for x in stats[2 + k : 2 + 2 * k]],
        sys_len=int(stats[0]),
        ref_len=int(stats[1]),
        smooth_method=metric.smooth_method,
        smooth_value=metric.smooth_value,
        effective_order=metric.effective_order,
        max_ngram_order=k,
    ).score)


def _resample_counts(n_items: int, n_samples: int, seed: int) -> np.ndarray:
    """How often each index is drawn in each bootstrap sample, shape ``(n_samples, n_items)``."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_items, size=(n_samples, n_items))
    flat = (idx + np.arange(n_samples)[:, None] * n_items).ravel()
    return np.bincount(flat, minlength=n_samples * n_items).reshape(n_samples, n_items)


def _ci95(samples: np.ndarray) -> list[float]:
    """The 2.5th and 97.5th percentiles of bootstrap samples."""
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return [float(lo), float(hi)]


def paired_bootstrap(
    hyps_a: list[str],
    hyps_b: list[str],
    refs: list[str],
    n_samples: int = 1000,
    seed: int = 12345,
    metric: Literal["bleu", "paper"] = "bleu",
    tokenize: Tokenizer | None = None,
    lowercase: bool = False,
    lang: str | None = None,
    names: tuple[str, str] = ("A", "B"),
) -> dict:
    """Paired bootstrap resampling (Koehn, 2004) of system A against system B.

    Sentence indices are drawn with replacement ``n_samples`` times; both systems are scored on
    the same draws. ``"bleu"`` is sacreBLEU corpus BLEU, recomputed from summed per-segment
    sufficient statistics; ``"paper"`` is the mean of :func:`paper_sentence_bleu`.

    :param hyps_a: outputs of system A.
    :param hyps_b: outputs of system B.
    :param refs: references.
    :param n_samples: number of bootstrap samples.
    :param seed: seed of the random generator; equal seeds give equal results.
    :param metric: ``"bleu"`` or ``"paper"``.
    :param tokenize: target tokeniser, required for ``metric="paper"``.
    :param lowercase: compare lowercased text, as :func:`corpus_scores`.
    :param lang: the references' language, for BLEU's tokeniser, as :func:`corpus_scores`.
    :param names: what the log line (and an error) calls systems A and B, e.g. ``("COMET seed 2", "Transformer seed 2")``.
    :return: ``{"metric", "label", "a", "b", "delta", "a_mean", "a_ci95", "b_mean", "b_ci95",
        "p_value", "n_samples", "runs"}``, where ``p_value`` is the fraction of samples in which B
        scores at least as high as A (one-sided test of "A is better"; ties count for B).
    """
    return paired_bootstrap_runs([hyps_a], [hyps_b], refs, n_samples, seed, metric, tokenize, lowercase, lang, names)


def paired_bootstrap_runs(
    runs_a: Sequence[Sequence[str]],
    runs_b: Sequence[Sequence[str]],
    refs: list[str],
    n_samples: int = 1000,
    seed: int = 12345,
    metric: Literal["bleu", "paper"] = "bleu",
    tokenize: Tokenizer | None = None,
    lowercase: bool = False,
    lang: str | None = None,
    names: tuple[str, str] = ("A", "B"),
) -> dict:
    """:func:`paired_bootstrap` over several runs per system (seeds), all on the same references.

    A sample draws sentence indices once and takes every run's output for them, so the test
    resamples the test set, not the runs. A system's ``"bleu"`` is the corpus BLEU of its runs'
    outputs concatenated (statistics summed over runs); its ``"paper"`` score is the mean over
    runs. Systems need not have the same number of runs; one run each is :func:`paired_bootstrap`.
    """
    if isinstance(refs, str) or any(isinstance(run, str) for run in (runs_a, runs_b, *runs_a, *runs_b)):
        # a string is a sequence of characters: three strings of one length were scored as that many one-character sentences
        raise TypeError("paired_bootstrap takes lists of sentences (one string per line), not one string")
    for name, runs in zip(names, (runs_a, runs_b)):
        if not runs:
            raise DataError(f"paired_bootstrap: system {name} has no runs")
        for k, hyps in enumerate(runs):
            if len(hyps) != len(refs):
                raise DataError(
                    f"paired_bootstrap: run {k + 1} of system {name} has {len(hyps)} hypotheses for "
                    f"{len(refs)} references; they must be aligned"
                )
    if not refs:
        raise DataError("paired_bootstrap: no sentences to resample")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    counts = _resample_counts(len(refs), n_samples, seed)

    if metric == "bleu":
        bleu = bleu_metric(lowercase, lang)
        stats_a = sum(_bleu_stats(bleu, hyps, refs) for hyps in runs_a)  # (n, 2 + 2 * order), summed over runs
        stats_b = sum(_bleu_stats(bleu, hyps, refs) for hyps in runs_b)
        full_a, full_b = _bleu_from_stats(bleu, stats_a.sum(0)), _bleu_from_stats(bleu, stats_b.sum(0))
        samples_a = np.array([_bleu_from_stats(bleu, s) for s in counts @ stats_a])
        samples_b = np.array([_bleu_from_stats(bleu, s) for s in counts @ stats_b])
        label = str(bleu.get_signature())
    elif metric == "paper":
        if tokenize is None:
            raise ValueError('paired_bootstrap(metric="paper") needs a tokenize function')
        tokenize = _lowercased(tokenize) if lowercase else tokenize
        scores_a = np.mean([_sentence_scores(hyps, refs, tokenize) for hyps in runs_a], axis=0)  # (n,)
        scores_b = np.mean([_sentence_scores(hyps, refs, tokenize) for hyps in runs_b], axis=0)
        full_a, full_b = float(scores_a.mean()), float(scores_b.mean())
        samples_a = counts @ scores_a / len(refs)
        samples_b = counts @ scores_b / len(refs)
        label = paper_label(lowercase)
    else:
        raise ValueError(f'metric must be "bleu" or "paper", got {metric!r}')

    p_value = float(np.mean(samples_b >= samples_a))
    # the systems by name: a report's log of several seeds and metrics said "A=... B=..." line after line
    logger.info("paired bootstrap (%s, %d + %d runs, %d samples): %s %.2f vs %s %.2f, p%s", metric, len(runs_a), len(runs_b),
                n_samples, names[0], full_a, names[1], full_b, f" < {1 / n_samples:g}" if p_value == 0 else f"={p_value:.4f}")  # as fmt_p
    return {
        "metric": metric,
        "label": label,
        "a": full_a,
        "b": full_b,
        "delta": full_a - full_b,
        "a_mean": float(samples_a.mean()),
        "a_ci95": _ci95(samples_a),
        "b_mean": float(samples_b.mean()),
        "b_ci95": _ci95(samples_b),
        "p_value": p_value,
        "n_samples": n_samples,
        "runs": [len(runs_a), len(runs_b)],
    }


# --------------------------------------------------------------------------------------------
# Full evaluation, reporting
# --------------------------------------------------------------------------------------------


def _check_aligned(hyps: Sequence[str], refs: Sequence[str]) -> None:
    """Raise :class:`DataError` unless there is exactly one hypothesis per reference."""
    if len(hyps) != len(refs):
        raise DataError(
            f"got {len(hyps)} hypotheses but {len(refs)} references; "
            "the hypothesis and reference files must have the same number of lines"
        )


def _check_references(refs: Sequence[str]) -> None:
    """Raise :class:`DataError` naming the first empty or blank reference (1-based line)."""
    for line_no, ref in enumerate(refs, start=1):
        if not ref.strip():
            raise DataError(f"reference line {line_no} is empty")


def _check_sources(src: Sequence[str], refs: Sequence[str]) -> None:
    """Raise :class:`DataError` unless there is exactly one source sentence per reference."""
    if len(src) != len(refs):
        raise DataError(
            f"got {len(src)} source sentences but {len(refs)} references; "
            "the source and reference files must have the same number of lines"
        )


def evaluate(
    hyps: list[str],
    refs: list[str],
    *,
    tokenize: Tokenizer,
    src: list[str] | None = None,
    src_tokenize: Tokenizer | None = None,
    per_sentence: bool = False,
    lowercase: bool = False,
    not_computed: str | None = None,
    lang: str | None = None,
    what: str = "",
) -> dict:
    """Score a test set: sacreBLEU BLEU/chrF, the COMET paper's metric and, given sources, Fig. 4.

    :param hyps: detokenised system outputs (an empty output is allowed and scores 0).
    :param refs: detokenised references; none may be blank.
    :param tokenize: target-language tokeniser for the paper metric; None: no paper metric, no
        BLEU by length and no ``sentence_bleu`` (``not_computed`` says why).
    :param src: source sentences; when given (and with ``src_tokenize`` or ``tokenize``),
        ``bleu_by_length`` is added.
    :param src_tokenize: source-language tokeniser giving the lengths (defaults to ``tokenize``).
    :param not_computed: why a part is missing (e.g. spaCy cannot tokenise the language),
        kept in the result as ``not_computed`` and shown by :func:`format_table`.
    :param per_sentence: also return ``sentence_bleu``, the paper metric of every sentence.
    :param lowercase: score lowercased text (a model trained with ``data.lowercase``); the
        signatures and the paper metric's label say so.
    :param lang: the references' language, for BLEU's tokeniser (:func:`corpus_scores`).
    :param what: what was scored, opening the log line ("comet seed1, valid: BLEU ..."), for
        callers that score many runs and splits in a row (reproduce, compare).
    :return: :func:`corpus_scores` plus ``paper_bleu``, ``paper_bleu_label``, ``n_sentences``
        and, with ``src``, ``bleu_by_length``.
    :raises DataError: on misaligned inputs, an empty set or a blank reference.
    """
    _check_aligned(hyps, refs)
    if not refs:
        raise DataError("no sentences to evaluate: the reference set is empty")
    _check_references(refs)
    if src is not None:
        _check_sources(src, refs)
    result = corpus_scores(hyps, refs, lowercase, lang)
    result["n_sentences"] = len(refs)
    if not_computed:
        result["not_computed"] = not_computed
    if tokenize is None:
        logger.info("%sBLEU %.2f, chrF %.2f on %d sentences", what and what + ": ", result["bleu"], result["chrf"], len(refs))
        return result
    tokenize = _lowercased(tokenize) if lowercase else tokenize
    hyps_tokens = [tokenize(h) for h in hyps]
    refs_tokens = [tokenize(r) for r in refs]
    sentence = [paper_sentence_bleu(h, r) for h, r in zip(hyps_tokens, refs_tokens)]
    result.update(
        paper_bleu=float(np.mean(sentence)),
        paper_bleu_label=paper_label(lowercase),
    )
    if per_sentence:
        result["sentence_bleu"] = [float(x) for x in sentence]
    if src is not None:
        src_tok = src_tokenize or tokenize
        lengths = [len(src_tok(s)) for s in src]
        result["bleu_by_length"] = bleu_by_length(lengths, hyps_tokens, refs_tokens)
        # the lengths it leaves out, so that reproduce's Figure 4 names those outside its plotted range too
        result["lengths_too_few"] = sorted(L for L, n in Counter(lengths).items() if n < BY_LENGTH_MIN_COUNT)
    logger.info("%sBLEU %.2f, chrF %.2f, paper BLEU %.2f on %d sentences", what and what + ": ",
                result["bleu"], result["chrf"], result["paper_bleu"], len(refs))
    return result


def score(
    hyps: Sequence[str],
    refs: Sequence[str],
    *,
    lang: str = "en",
    src: Sequence[str] | None = None,
    src_lang: str = "de",
    per_sentence: bool = False,
    lowercase: bool = False,
) -> dict:
    """What ``cometnmt evaluate`` reports: :func:`evaluate` with the paper metric on spaCy word
    tokens of ``lang`` and, given ``src``, BLEU by source length counted in spaCy tokens of
    ``src_lang``.

    Example::

        result = score(["A man rides a bike."], ["A man is riding a bike."], lang="en")
        result["bleu"], result["chrf"], result["paper_bleu"]
    """
    lang, src_lang = language_code(lang, "lang"), language_code(src_lang, "src_lang")
    if isinstance(hyps, str) or isinstance(refs, str) or isinstance(src, str):
        raise TypeError("score takes lists of sentences (one string per line), not one string")
    hyps, refs, src = list(hyps), list(refs), None if src is None else list(src)
    for name, lines in (("hyps", hyps), ("refs", refs), ("src", src or [])):
        bad = next((i for i, x in enumerate(lines) if not isinstance(x, str)), None)
        if bad is not None:
            hint = " (Translator.translate gives lists of Translation: take [0].text)" if name == "hyps" else ""
            raise TypeError(f"{name}[{bad}] is {a_type(lines[bad])}, not a string{hint}")
    # a byte order mark opening a line is no text, as the file readers and Translator have it
    # (decode_lines): kept, it made the first word another (an exact match scored BLEU 76.0)
    from cometnmt.data.corpus import drop_byte_order_marks

    hyps, refs = drop_byte_order_marks(hyps), drop_byte_order_marks(refs)
    src = None if src is None else drop_byte_order_marks(src)
    tgt_tok, src_tok = paper_tokenizers(lang, src_lang if src is not None else None)
    return score_with(hyps, refs, tgt_tok, src_tok, lang=lang, src_lang=src_lang, src=src,
                      per_sentence=per_sentence, lowercase=lowercase)


def language_code(value: object, name: str, flag: str | None = None) -> str:
    """``value`` as a language code, lower-cased ('EN' -> 'en'). Anything but two or three letters
    ('en_US', '', 5) is a ConfigError naming the keyword ``name`` (or the CLI's ``flag``): before, it
    was taken as a language spaCy lacks, and the paper's metric was left out with a warning only."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z]{2,3}", value):
        raise ConfigError(f"{setting(name, repr(value), flag is not None, flag)}: not a language code (two or three "
                          "letters, such as en, de, fr)")
    return value.lower()


def paper_tokenizers(lang: str, src_lang: str | None) -> tuple:
    """The spaCy tokenizers :func:`score_with` takes: the target's, and the source's (for BLEU by
    length) when ``src_lang`` is given and the target's exists; None where spaCy cannot tokenise
    the language (a warning says so, before any decoding; once a language inside
    :func:`~cometnmt.data.tokenizers.warn_once_a_language`)."""
    from cometnmt.data.tokenizers import paper_tokenizer

    tgt_tok = paper_tokenizer(lang)
    return tgt_tok, paper_tokenizer(src_lang) if src_lang is not None and tgt_tok is not None else None


def score_with(hyps: list[str], refs: list[str], tgt_tok, src_tok, *, lang: str, src_lang: str,
               src: list[str] | None = None, per_sentence: bool = False, lowercase: bool = False,
               what: str = "") -> dict:
    """:func:`score` with spaCy tokenizers already built (:func:`paper_tokenizers`), either None where
    spaCy cannot tokenise the language: without the target's, BLEU and chrF alone; without the
    source's, no BLEU by length (lengths in another language's tokens would be wrong). ``what``
    opens the log line (:func:`evaluate`)."""
    why = None
    if tgt_tok is None:
        why = (f"the COMET paper's metric{' and BLEU by length' if src is not None else ''}: "
               f"spaCy cannot tokenise {lang!r}")  # BLEU by length only where the sources were given
    elif src is not None and src_tok is None:
        why = f"BLEU by length: spaCy cannot tokenise {src_lang!r}"
    if src is not None and src_tok is None:
        _check_sources(src, refs)
        src = None
    result = evaluate(hyps, refs, tokenize=tgt_tok.tokenize if tgt_tok else None, src=src,
                      src_tokenize=src_tok.tokenize if src_tok else None, per_sentence=per_sentence,
                      lowercase=lowercase, not_computed=why, lang=lang, what=what)
    return {**result, "lang": lang, **({"src_lang": src_lang} if src is not None else {})}


def format_table(result: dict) -> str:
    """A human-readable, aligned table of an :func:`evaluate` result.

    :param result: the dictionary returned by :func:`evaluate`.
    :return: a multi-line string (no trailing newline).
    """
    rows = [
        ("BLEU", f"{result['bleu']:.2f}", result.get("bleu_signature", "")),
        ("chrF", f"{result['chrf']:.2f}", result.get("chrf_signature", "")),
        *([("paper BLEU", f"{result['paper_bleu']:.2f}", result.get("paper_bleu_label", PAPER_BLEU_LABEL))]
          if "paper_bleu" in result else []),
        ("sentences", str(result["n_sentences"]), ""),
        *([("not computed", "", result["not_computed"])] if result.get("not_computed") else []),
        # evaluate --checkpoint's split: the files a reader scores --hyp-out against with sacreBLEU itself
        *((name, "", result[key] + _first_lines(result)) for name, key in (("source", "source_file"),
                                                                          ("reference", "reference_file"))
          if key in result),
    ]
    name_w = max(len(r[0]) for r in rows)
    score_w = max(len(r[1]) for r in rows)
    lines = [f"{name:<{name_w}}  {score:>{score_w}}  {note}".rstrip() for name, score, note in rows]
    by_length = result.get("bleu_by_length")
    if by_length is not None:  # asked for (a source was given); lengths with fewer sentences are too noisy
        lines += ["", f"paper BLEU by source length (lengths with at least {BY_LENGTH_MIN_COUNT} sentences)"]
        if not by_length:  # it was silently left out of the table
            lines += ["  none: no source length has that many sentences"]
        else:
            lines += [f"{'length':>6}  {'count':>5}  {'BLEU':>6}"]
            lines += [f"{r['length']:>6}  {r['count']:>5}  {r['paper_bleu']:>6.2f}" for r in by_length]
    return "\n".join(lines)


def _first_lines(result: dict) -> str:
    """' (the first N of its M lines)' where evaluate --checkpoint scored fewer sentences than the
    split's files hold (--limit, data.max_valid_pairs; training's split skips empty pairs too)."""
    n, lines = result["n_sentences"], result.get("reference_lines", result["n_sentences"])
    if n == lines:
        return ""
    return f" ({n} of its {lines} lines)" if result.get("split") == "train" else f" (the first {n} of its {lines} lines)"


def write_json(result: dict, path: str | Path) -> None:
    """Write ``result`` as JSON atomically (``write_text_file``: a temporary file in the same
    folder, then ``os.replace``). A number that is not finite is written as null: JSON has no NaN
    or Infinity, and json.dumps wrote them as such (``logprob --json`` of a model whose weights
    hold NaN), which strict readers (JavaScript, Go, jq) refuse; ``serve`` answers them as null too.

    :param result: a JSON-serialisable dictionary (e.g. from :func:`evaluate`).
    :param path: destination file; its parent folders are created when missing.
    """
    from cometnmt.data.corpus import write_text_file
    from cometnmt.training.run_files import null_nonfinite

    write_text_file(path, json.dumps(null_nonfinite(result), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    logger.debug("wrote %s", path)


