"""Tests for cometnmt.evaluation: sacreBLEU scores, the COMET paper metric, bootstrap, reporting."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from pathlib import Path

import pytest
import sacrebleu

from cometnmt.errors import DataError
from cometnmt.evaluation import (
    PAPER_BLEU_LABEL,
    bleu_by_length,
    corpus_scores,
    evaluate,
    format_table,
    paired_bootstrap,
    paired_bootstrap_runs,
    paper_bleu,
    paper_sentence_bleu,
    write_json,
)

VAL_EN = Path("/work/shared/data/multi30k/val.en.gz")


def _perturb(sentence: str, rng: random.Random) -> str:
    """A plausible 'system output': drop, duplicate and swap some words of a reference."""
    words = sentence.split()
    out = []
    for w in words:
        r = rng.random()
        if r < 0.15:
            continue
        out.append(w.lower() if r < 0.25 else w)
        if r > 0.93:
            out.append(w)
    if len(out) > 3 and rng.random() < 0.5:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return " ".join(out)


@pytest.fixture(scope="module")
def val_refs() -> list[str]:
    if not VAL_EN.exists():
        pytest.skip(f"{VAL_EN} not available")
    with gzip.open(VAL_EN, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="module")
def val_hyps(val_refs) -> list[str]:
    rng = random.Random(0)
    return [_perturb(r, rng) for r in val_refs]


# ------------------------------------------------------------------ corpus_scores


def test_corpus_scores_match_sacrebleu(val_refs, val_hyps):
    refs, hyps = val_refs[:40], val_hyps[:40]
    got = corpus_scores(hyps, refs)
    bleu = sacrebleu.metrics.BLEU()
    expected = bleu.corpus_score(hyps, [refs])
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-12)
    assert got["bleu"] == pytest.approx(expected.score, abs=1e-12)
    assert got["bleu_signature"] == str(bleu.get_signature())
    assert "tok:13a" in got["bleu_signature"] and "case:mixed" in got["bleu_signature"]
    chrf = sacrebleu.metrics.CHRF()
    assert got["chrf"] == pytest.approx(chrf.corpus_score(hyps, [refs]).score, abs=1e-12)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-12)
    assert got["chrf_signature"] == str(chrf.get_signature())
    assert 0 < got["bleu"] < 100 and 0 < got["chrf"] < 100


# ------------------------------------------------------------------ paper_sentence_bleu


def test_paper_sentence_bleu_matches_nltk_method2():
    bleu_score = pytest.importorskip("nltk.translate.bleu_score")
    smooth = bleu_score.SmoothingFunction().method2
    rng = random.Random(1234)
    vocab = "a man woman dog the runs on grass red ball".split()
    n_cases = 0
    for i in range(250):
        ref = [rng.choice(vocab) for _ in range(rng.randint(1, 14))]
        if i % 5 == 0:  # near-copies, so higher-order matches are common
            hyp = [w for w in ref if rng.random() > 0.2]
        else:
            hyp = [rng.choice(vocab) for _ in range(rng.randint(0, 14))]
        expected = 100 * bleu_score.sentence_bleu([ref], hyp, smoothing_function=smooth)
        assert paper_sentence_bleu(hyp, ref) == pytest.approx(expected, rel=1e-12, abs=1e-12), (hyp, ref)
        n_cases += 1
    assert n_cases == 250


def test_paper_sentence_bleu_hand_cases():
    sent = "a man rides a red bike".split()
    assert paper_sentence_bleu(sent, sent) == pytest.approx(100.0)
    # no common word: p1 = 0, so the score is 0 whatever the smoothing of n >= 2
    assert paper_sentence_bleu("x y z w".split(), "a b c d".split()) == 0.0
    # all unigrams match, no bigram does: p = 4/4, 1/4, 1/3, 1/2; BP = 1
    assert paper_sentence_bleu("a b c d".split(), "d c b a".split()) == pytest.approx(
        100 * (1 * 1 / 4 * 1 / 3 * 1 / 2) ** 0.25
    )
    # 1-token hypothesis: p1 = 1, p2..p4 = (0+1)/(1+1) (empty order counts as 1, NLTK convention),
    # BP = exp(1 - 3/1)
    assert paper_sentence_bleu(["a"], "a b c".split()) == pytest.approx(
        100 * math.exp(-2) * 0.5 ** 0.75
    )
    # an identical 1-token sentence does not reach 100 under this smoothing
    assert paper_sentence_bleu(["a"], ["a"]) == pytest.approx(100 * 0.5 ** 0.75)
    assert paper_sentence_bleu([], "a b".split()) == 0.0


def test_paper_bleu_is_mean_of_sentence_scores():
    hyps = ["a man rides a bike", "the dog", ""]
    refs = ["a man rides a red bike", "the dog runs", "two women"]
    expected = sum(paper_sentence_bleu(h.split(), r.split()) for h, r in zip(hyps, refs)) / 3
    assert paper_bleu(hyps, refs, str.split) == pytest.approx(expected)


# ------------------------------------------------------------------ bleu_by_length


def test_bleu_by_length_drops_rare_lengths():
    lengths = [2, 2, 2, 5, 5, 7, 7, 7, 7]
    refs = [["a", "b", "c", "d", "e"]] * len(lengths)
    hyps = [["a", "b", "c", "d", "e"]] * 3 + [["a"]] * 2 + [["a", "b", "c", "d", "x"]] * 4
    rows = bleu_by_length(lengths, hyps, refs)
    assert [r["length"] for r in rows] == [2, 7]
    assert [r["count"] for r in rows] == [3, 4]
    assert rows[0]["paper_bleu"] == pytest.approx(100.0)
    assert rows[1]["paper_bleu"] == pytest.approx(paper_sentence_bleu(hyps[-1], refs[-1]))
    assert [r["length"] for r in bleu_by_length(lengths, hyps, refs, min_count=2)] == [2, 5, 7]


# ------------------------------------------------------------------ paired_bootstrap


def test_paired_bootstrap_detects_better_system(val_refs):
    refs = val_refs[:60]
    garbage = [" ".join(reversed(r.lower().split()))[:20] for r in refs]
    res = paired_bootstrap(refs, garbage, refs, n_samples=300)
    assert res["delta"] > 0 and res["p_value"] < 0.05
    assert res["a"] == pytest.approx(100.0)
    assert res["a"] == pytest.approx(corpus_scores(refs, refs)["bleu"])
    assert res["b"] == pytest.approx(corpus_scores(garbage, refs)["bleu"])
    assert res["b_ci95"][0] <= res["b_mean"] <= res["b_ci95"][1]
    res = paired_bootstrap(refs, garbage, refs, n_samples=300, metric="paper", tokenize=str.split)
    assert res["delta"] > 0 and res["p_value"] < 0.05
    assert res["a"] == pytest.approx(100.0)
    assert res["b"] == pytest.approx(paper_bleu(garbage, refs, str.split))


def test_paired_bootstrap_identical_systems_and_determinism(val_refs, val_hyps):
    refs, hyps = val_refs[:80], val_hyps[:80]
    res = paired_bootstrap(hyps, list(hyps), refs, n_samples=200)
    assert res["delta"] == 0
    assert res["p_value"] >= 0.5  # ties count for B
    assert res["n_samples"] == 200 and res["metric"] == "bleu"
    other = _perturb_all(hyps)
    r1 = paired_bootstrap(hyps, other, refs, n_samples=200, seed=7)
    r2 = paired_bootstrap(hyps, other, refs, n_samples=200, seed=7)
    r3 = paired_bootstrap(hyps, other, refs, n_samples=200, seed=8)
    assert r1 == r2
    assert r1["a_ci95"] != r3["a_ci95"]
    json.dumps(r1)  # plain Python types only


def test_paired_bootstrap_refuses_one_string_for_a_list():
    """As score does: three strings of one length were resampled as that many one-character sentences."""
    for args in (("a dog runs", "a cat sits", "a dog runs"), (["a dog"], ["a cat"], "x"), (["a dog"], "x", ["a dog"])):
        with pytest.raises(TypeError, match="paired_bootstrap takes lists of sentences"):
            paired_bootstrap(*args, n_samples=10)
    with pytest.raises(TypeError, match="paired_bootstrap takes lists of sentences"):
        paired_bootstrap_runs(["a dog", "a cat"], [["a dog"]], ["a dog"], n_samples=10)  # runs, not one run


def _perturb_all(sentences: list[str]) -> list[str]:
    rng = random.Random(99)
    return [_perturb(s, rng) for s in sentences]


def test_paired_bootstrap_full_set_is_fast_and_matches_corpus_bleu(val_refs, val_hyps):
    refs, hyps = val_refs[:1000], val_hyps[:1000]
    other = _perturb_all(hyps)
    res = paired_bootstrap(hyps, other, refs, n_samples=1000)
    assert res["a"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert res["b"] == pytest.approx(sacrebleu.corpus_bleu(other, [refs]).score, abs=1e-9)
    assert res["a_ci95"][0] < res["a"] < res["a_ci95"][1]


def test_paired_bootstrap_rejects_misaligned():
    with pytest.raises(DataError, match="run 1 of system B has 1 hypotheses for 2 references"):
        paired_bootstrap(["a", "b"], ["a"], ["a", "b"])
    with pytest.raises(DataError, match="system A has no runs"):
        paired_bootstrap_runs([], [["a"]], ["a"])


def test_paired_bootstrap_over_seeds_scores_the_concatenated_runs(val_refs, val_hyps):
    refs, hyps = val_refs[:120], val_hyps[:120]
    runs_a = [hyps, _perturb_all(hyps)]
    runs_b = [_perturb_all(runs_a[1]), _perturb_all(_perturb_all(hyps)), [r.lower() for r in refs]]
    res = paired_bootstrap_runs(runs_a, runs_b, refs, n_samples=200)
    # A system's score is corpus BLEU of its runs concatenated, against the references repeated.
    for key, runs in (("a", runs_a), ("b", runs_b)):
        assert res[key] == pytest.approx(sacrebleu.corpus_bleu([h for r in runs for h in r], [refs * len(runs)]).score, abs=1e-9)
    assert res["runs"] == [2, 3]
    paper = paired_bootstrap_runs(runs_a, runs_b, refs, n_samples=200, metric="paper", tokenize=str.split)
    assert paper["a"] == pytest.approx(sum(paper_bleu(r, refs, str.split) for r in runs_a) / 2)
    # One run each is the single-run test, draw for draw.
    single = paired_bootstrap(hyps, runs_b[0], refs, n_samples=200, seed=3)
    assert paired_bootstrap_runs([hyps], [runs_b[0]], refs, n_samples=200, seed=3) == single
    # Resampling is over sentences, shared by all runs: identical runs add no evidence.
    doubled = paired_bootstrap_runs([hyps, hyps], [runs_b[0], runs_b[0]], refs, n_samples=200, seed=3)
    assert doubled["p_value"] == single["p_value"] and doubled["a"] == pytest.approx(single["a"])


# ------------------------------------------------------------------ evaluate, reporting


def test_evaluate_full_result(val_refs, val_hyps):
    refs, hyps = val_refs[:50], val_hyps[:50]
    hyps = hyps[:-1] + [""]  # an empty hypothesis is allowed
    res = evaluate(hyps, refs, tokenize=str.split, src=refs, src_tokenize=str.split)
    assert res["n_sentences"] == 50
    assert res["paper_bleu_label"] == PAPER_BLEU_LABEL
    assert res["paper_bleu"] == pytest.approx(paper_bleu(hyps, refs, str.split))
    assert res["bleu"] == pytest.approx(corpus_scores(hyps, refs)["bleu"])
    rows = res["bleu_by_length"]
    assert rows and all(r["count"] >= 3 for r in rows)
    assert [r["length"] for r in rows] == sorted(r["length"] for r in rows)
    assert "bleu_by_length" not in evaluate(hyps, refs, tokenize=str.split)
    table = format_table(res)
    for needle in ("BLEU", res["bleu_signature"], res["chrf_signature"], PAPER_BLEU_LABEL,
                   "sentences", f"{res['bleu']:.2f}", "source length"):
        assert needle in table


def test_evaluate_rejects_count_mismatch():
    with pytest.raises(DataError, match=r"3 hypotheses but 2 references"):
        evaluate(["a", "b", "c"], ["a", "b"], tokenize=str.split)


def test_evaluate_rejects_empty_reference():
    with pytest.raises(DataError, match=r"reference line 2 is empty"):
        evaluate(["a b", "c d", "e"], ["a b", "   ", "e"], tokenize=str.split)


def test_write_json_round_trips(tmp_path):
    result = evaluate(["a man rides a bike ."], ["a man rides a red bike ."], tokenize=str.split)
    path = tmp_path / "sub" / "scores.json"
    write_json(result, path)
    assert json.loads(path.read_text(encoding="utf-8")) == result
    write_json({"bleu": 1.5}, str(path))  # overwrite in place
    assert json.loads(path.read_text(encoding="utf-8")) == {"bleu": 1.5}
    assert [p.name for p in path.parent.iterdir()] == ["scores.json"]  # no temp file left


def test_lowercase_scores_a_lowercased_model_fairly() -> None:
    """A model trained with data.lowercase writes lowercase; against cased references its BLEU
    counted every capital as an error."""
    from cometnmt.data.tokenizers import SpacyTokenizer
    from cometnmt.evaluation import paired_bootstrap, score

    refs = ["A man rides a bike in Berlin.", "Two dogs play."]
    hyps = [r.lower() for r in refs]
    cased, lower = score(hyps, refs), score(hyps, refs, lowercase=True)
    assert cased["bleu"] < 60 and lower["bleu"] == pytest.approx(100.0) and lower["paper_bleu"] == pytest.approx(100.0)
    assert "case:lc" in lower["bleu_signature"] and "case:lc" in lower["chrf_signature"]
    assert lower["paper_bleu_label"].endswith(", lowercased") and not cased["paper_bleu_label"].endswith("lowercased")
    tok = SpacyTokenizer("en").tokenize
    for metric in ("bleu", "paper"):
        res = paired_bootstrap(hyps, refs, refs, n_samples=50, metric=metric, tokenize=tok, lowercase=True)
        assert res["delta"] == pytest.approx(0.0)  # lowercase output is as good as the cased refs


def test_language_codes_are_checked_and_recorded(cli, tmp_path):
    """--lang EN (a case slip), en_US or '' was taken as a language spaCy lacks: exit 0, the
    paper's metric left out with a warning only, and the JSON did not say which language scored it.
    Case is normalised, non-codes are refused by name, and the result records the language."""
    from cometnmt.errors import ConfigError
    from cometnmt.evaluation import score

    result = score(["A man rides a bike."], ["A man is riding a bike."], lang="EN")
    assert result["lang"] == "en" and "paper_bleu" in result and "src_lang" not in result
    assert score(["Ein Mann."], ["Ein Mann."], lang="de", src=["A man."], src_lang="EN")["src_lang"] == "en"
    for bad, shown in [("en_US", "lang='en_US'"), ("", "lang=''"), (5, "lang=5")]:
        with pytest.raises(ConfigError, match=f"^{re.escape(shown)}: not a language code"):
            score(["a"], ["a"], lang=bad)
    (tmp_path / "h.txt").write_text("A man rides a bike.\n", encoding="utf-8")
    proc = cli("evaluate", "--hyp", str(tmp_path / "h.txt"), "--ref", str(tmp_path / "h.txt"), "--lang", "en_US", check=False)
    assert proc.returncode == 2 and "--lang 'en_US': not a language code (two or three letters" in proc.stderr
    proc = cli("evaluate", "--hyp", str(tmp_path / "h.txt"), "--ref", str(tmp_path / "h.txt"), "--lang", "EN",
               "--json", str(tmp_path / "s.json"))
    assert json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))["lang"] == "en"


def test_the_table_says_when_no_length_has_enough_sentences():
    """With a source, a table whose every length had fewer than 3 sentences showed no by-length
    section at all, as if none had been asked for."""
    from cometnmt.evaluation import format_table, score

    few = score(["A dog runs.", "Two cats."], ["A dog runs.", "Two cats sleep."], lang="en",
                src=["Ein Hund läuft.", "Zwei Katzen."], src_lang="de")
    assert few["bleu_by_length"] == []
    assert "no source length has that many sentences" in format_table(few)
    three = score(["A dog."] * 3, ["A dog."] * 3, lang="en", src=["Ein Hund."] * 3, src_lang="de")
    table = format_table(three)
    assert "(lengths with at least 3 sentences)" in table and "none:" not in table
    assert re.search(r"^ +3 +3 +[0-9.]+$", table, re.M)  # length 3 (tokens), 3 sentences
    assert "by source length" not in format_table(score(["A dog."], ["A dog."], lang="en"))  # not asked for


@pytest.mark.parametrize("hyp", [
    "A man in a <unk> shirt is sitting on a <unk> .",
    "A man in a <unk>-shirt is sitting on a bench.",
    "Un homme en <unk>-shirt assis sur un banc.",
])
def test_paper_metric_counts_the_models_unknown_word_as_one_word(hyp) -> None:
    """A translation writes the model's unknown word as the text <unk>, one token of its output, and
    the paper scores the model's tokens. spaCy alone cut it into '<', 'unk', '>' (three unmatched
    tokens in place of one) and '<unk>-shirt' into '<', 'unk>-shirt', losing the match of 'shirt'.
    Every tokenizer the paper metric is computed with (evaluate, validation, reproduce) now reads it
    as one word: the score equals that of any other word the reference lacks."""
    from cometnmt.data.tokenizers import metric_tokenizer, paper_tokenizer
    from cometnmt.evaluation import score

    lang = "fr" if hyp.startswith("Un") else "en"
    ref = ("Un homme en t-shirt rouge est assis sur un banc." if lang == "fr"
           else "A man in a red t-shirt is sitting on a wooden bench.")
    other = hyp.replace("<unk>", "zzyzx")  # a word the reference lacks
    assert score([hyp], [ref], lang=lang)["paper_bleu"] == pytest.approx(score([other], [ref], lang=lang)["paper_bleu"])
    for tok in (metric_tokenizer(lang), paper_tokenizer(lang)):
        assert tok.tokenize(hyp) == [t.replace("zzyzx", "<unk>") for t in tok.tokenize(other)]


def test_score_drops_a_byte_order_mark_opening_a_line_as_the_file_readers_do():
    """cometnmt.score took a hypothesis opening with U+FEFF (the first line of a file read with
    open(path, encoding="utf-8")) as text: its first word became another, BLEU 59.5 for an exact
    match. The file readers and Translator drop such marks; score does now too."""
    from cometnmt.evaluation import score

    plain = score(["A man rides a bike ."], ["A man rides a bike ."], lang="en")
    marked = score(["\ufeffA man rides a bike ."], ["A man rides a bike ."], lang="en",
                   src=["\ufeffEin Mann fährt Rad ."], src_lang="de")
    assert score(["A man rides a bike ."], ["\ufeffA man rides a bike ."], lang="en")["bleu"] == pytest.approx(100.0)
    assert plain["bleu"] == marked["bleu"] == pytest.approx(100.0)
    assert marked["paper_bleu"] == plain["paper_bleu"]


def test_bleu_tokenises_as_sacrebleu_does_for_the_target_language(monkeypatch, caplog):
    """BLEU was always sacreBLEU's 13a tokeniser, which reads text written without spaces as a word
    or two: a Chinese translation one character short of its reference scored 0. It now takes the
    tokeniser sacreBLEU chooses for the references' language (sacrebleu -l xx-zh: tok:zh), in score,
    evaluate, corpus_scores (validation BLEU) and the bootstrap test; other languages keep 13a, and
    a language whose tokeniser is not installed (Japanese without sacrebleu[ja]) falls back to 13a
    with a warning."""
    import cometnmt
    import cometnmt.evaluation as evaluation

    hyps, refs = ["他们在公园里玩。", "一只狗在跑。"], ["他们在公园玩。", "一只狗在跑。"]
    assert corpus_scores(hyps[:1], refs[:1])["bleu"] == 0.0  # 13a: one word each
    zh = corpus_scores(hyps[:1], refs[:1], lang="zh")
    assert "tok:zh" in zh["bleu_signature"] and zh["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps[:1], [refs[:1]], tokenize="zh").score)
    assert zh["bleu"] > 50
    scored = cometnmt.score(hyps, refs, lang="zh")
    assert "tok:zh" in scored["bleu_signature"] and scored["bleu"] > 50
    assert "tok:zh" in paired_bootstrap(hyps, refs, refs, n_samples=10, lang="zh")["label"]
    en = cometnmt.score(["A dog runs."], ["A dog is running."], lang="en")
    assert en["bleu_signature"] == corpus_scores(["A dog runs."], ["A dog is running."])["bleu_signature"]
    assert "tok:13a" in en["bleu_signature"]

    real = evaluation.BLEU

    def without_extras(*, lowercase=False, trg_lang=""):
        if trg_lang:
            raise RuntimeError("\nXx tokenization requires extra dependencies, but you do not have them installed.\n")
        return real(lowercase=lowercase)

    monkeypatch.setattr(evaluation, "BLEU", without_extras)
    monkeypatch.setattr(evaluation, "_BLEU_FALLBACK_WARNED", set())
    with caplog.at_level("WARNING", logger="cometnmt.evaluation"):
        assert "tok:13a" in corpus_scores(hyps, refs, lang="xx")["bleu_signature"]
        corpus_scores(hyps, refs, lang="xx")
    assert [r.getMessage() for r in caplog.records if r.name == "cometnmt.evaluation"] == [
        "BLEU for 'xx' is computed with sacreBLEU's 13a tokeniser, not the one it uses for that language: "
        "Xx tokenization requires extra dependencies, but you do not have them installed."]
