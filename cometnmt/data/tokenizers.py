"""Tokenizers: spaCy rule-based words (detokenized with Moses) and in-memory SentencePiece models."""

from __future__ import annotations

import io
import logging
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Literal, Protocol, runtime_checkable

import sentencepiece as spm

from cometnmt.errors import DataError

if TYPE_CHECKING:  # spaCy (~0.4 s) loads where a SpacyTokenizer builds its pipeline, sacremoses (~0.2 s, its
    import spacy  # tokenizer's regexes) where it first detokenizes
    from sacremoses import MosesDetokenizer

logger = logging.getLogger(__name__)

# An intra-word hyphen split off by spaCy ("t-shirt" -> t - shirt) is emitted as Moses' "@-@" marker,
# which MosesDetokenizer glues back ("t @-@ shirt" -> "t-shirt"); a free-standing " - " stays "-".
HYPHEN_MARKER = "@-@"
_STATE_VERSION = 1
_SP_THREADS = 4  # fixed (not cpu_count) so the trained model is the same on every machine


# spaCy's tokenizer exceptions split some words where Moses' detokenizer does not join them again:
# English "don't" -> do n't, "gonna" -> gon na, "gotta" -> got ta; French "dit-il" -> dit -il;
# German "Geht’s" -> Geht ’s (with the typographic apostrophe only; "Geht's" stays one token).
_EN_NEGATION = re.compile(r"^n[’']t$", re.IGNORECASE)
_EN_SPLIT_WORDS = {("gon", "na"), ("wan", "na"), ("got", "ta")}
_FR_HYPHEN_CLITIC = re.compile(r"^-(t|(t-)?(je|tu|il|elle|on|nous|vous|ils|elles|ce|le|la|les|lui|leur|moi|toi|y|en|là|ci))$",
                               re.IGNORECASE)


def join_clitics(tokens: list[str], lang: str) -> list[str]:
    """Undo the splits spaCy makes inside words (see above) that Moses' detokenizer leaves apart;
    other languages' tokens are returned as they are."""
    out: list[str] = []
    for tok in tokens:
        glue = out and (
            (lang == "en" and (_EN_NEGATION.match(tok) or (out[-1].lower(), tok.lower()) in _EN_SPLIT_WORDS))
            or (lang == "fr" and _FR_HYPHEN_CLITIC.match(tok))
            or (lang == "de" and tok in ("\u2019s", "\u2019S"))
        )
        if glue:
            out[-1] += tok
        else:
            out.append(tok)
    return out


class UnknownLanguageError(DataError):
    """spaCy has no tokenizer for the language asked for."""


class VocabSizeError(DataError):
    """SentencePiece cannot train a vocabulary of the size asked for on this text."""


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token strings; ``state_dict`` is plain Python so it pickles into a checkpoint."""

    kind: str

    def tokenize(self, text: str) -> list[str]: ...

    def tokenize_many(self, texts: Iterable[str]) -> list[list[str]]: ...

    def detokenize(self, tokens: list[str]) -> str: ...

    def state_dict(self) -> dict: ...


def _blank_tokenizer(lang: str) -> spacy.tokenizer.Tokenizer:
    """The rule-based tokenizer of ``spacy.blank(lang)`` (no statistical model needed)."""
    import spacy

    try:
        return spacy.blank(lang).tokenizer
    except (ImportError, KeyError, ValueError) as exc:
        raise UnknownLanguageError(f"spaCy has no tokenizer for language {lang!r} ({exc})") from None


def _moses_detokenizer(lang: str) -> MosesDetokenizer:
    """sacremoses' detokenizer for ``lang`` (any code: one Moses has no rules for is detokenized
    by its language-independent rules)."""
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


_BUILD_LOCK = threading.Lock()  # a Translator serves several threads (cometnmt serve): one builds a lazy part


def _doc_tokens(doc: spacy.tokens.Doc) -> list[str]:
    """Token strings of a spaCy Doc, without whitespace tokens, intra-word hyphens as "@-@"."""
    out = []
    last = len(doc) - 1
    for i, tok in enumerate(doc):
        if tok.is_space:
            continue
        glued = 0 < i < last and tok.text == "-" and not tok.whitespace_ and not doc[i - 1].whitespace_
        out.append(HYPHEN_MARKER if glued else tok.text)
    return out


UNK_TEXT = "<unk>"  # the unknown token as a model's output spells it (Vocab's SPECIALS[1])
# What UNK_TEXT stands for while spaCy tokenises: a plain word, so that it is split off its
# neighbours ("<unk>-shirt", "l'<unk>", "<unk>.") as a word there would be; spaCy itself cuts
# "<unk>" into "<", "unk", ">", or leaves "<unk>." whole, depending on the language and context.
_UNK_WORD = "cometnmtunkword"
_TYPOGRAPHIC = ("\u2019", "\u2018")  # ’ (the typographic apostrophe, a closing single quote) and ‘ (opening)


class SpacyTokenizer:
    """Word tokenizer: ``spacy.blank(lang).tokenizer``; detokenized with sacremoses' MosesDetokenizer.

    ``unk_word``: read the text ``<unk>`` as the single token ``<unk>`` (the unknown word), and
    place it as a word when detokenizing, as a model's codec does: a translation holding ``<unk>``
    then tokenises back to the tokens it was decoded from, so ``logprob`` scores it as search did.
    The paper metric's tokenizer (:func:`metric_tokenizer`) reads it so too.

    Each half is built where it is first used, as each costs a start-up: detokenizing needs Moses
    alone (sacremoses, ~0.2 s to import) and tokenizing spaCy's pipeline alone (its import ~0.4 s
    and ``spacy.blank``, 0.1-0.2 s a language). A translator tokenizes its source and detokenizes
    its target, the paper metric only tokenizes. ``lazy``: build spaCy's pipeline on first use too,
    not now; without it the pipeline is built here, so a language spaCy cannot tokenise is an
    :class:`UnknownLanguageError` at once (a config checked before training, the paper metric).
    A checkpoint's target side is lazy (:func:`tokenizer_from_state`): spaCy tokenised its language
    in training, and translating never tokenizes a target."""

    kind = "spacy"

    def __init__(self, lang: str, lowercase: bool = False, *, unk_word: bool = False, lazy: bool = False) -> None:
        self.lang = lang
        self.lowercase = lowercase
        self.unk_word = unk_word
        self._spacy: spacy.tokenizer.Tokenizer | None = None if lazy else _blank_tokenizer(lang)
        self._moses_detok: MosesDetokenizer | None = None

    def _built(self, attribute: str, build: Callable[[str], object]):
        """The half kept in ``attribute``, made by ``build(lang)`` on first use (by one thread)."""
        if (part := getattr(self, attribute)) is None:
            with _BUILD_LOCK:
                if (part := getattr(self, attribute)) is None:
                    part = build(self.lang)
                    setattr(self, attribute, part)
        return part

    @property
    def _tokenizer(self) -> spacy.tokenizer.Tokenizer:
        """spaCy's pipeline for ``lang``, built on first use where ``lazy``."""
        return self._built("_spacy", _blank_tokenizer)

    @property
    def _detok(self) -> MosesDetokenizer:
        """Moses' detokenizer for ``lang``, built by the first :meth:`detokenize`."""
        return self._built("_moses_detok", _moses_detokenizer)

    def _prepare(self, text: str) -> str:
        text = text.lower() if self.lowercase else text
        return text.replace(UNK_TEXT, _UNK_WORD) if self.unk_word else text

    def _tokens(self, doc: spacy.tokens.Doc) -> list[str]:
        tokens = _doc_tokens(doc)
        return [tok.replace(_UNK_WORD, UNK_TEXT) for tok in tokens] if self.unk_word else tokens

    def tokenize(self, text: str) -> list[str]:
        """Tokens of one sentence."""
        return self._tokens(self._tokenizer(self._prepare(text)))

    def tokenize_many(self, texts: Iterable[str]) -> list[list[str]]:
        """Tokens of many sentences (spaCy's batched ``pipe``: 29k sentences in about a second)."""
        docs = self._tokenizer.pipe((self._prepare(t) for t in texts), batch_size=1000)
        return [self._tokens(doc) for doc in docs]

    def detokenize(self, tokens: list[str]) -> str:
        """Plain text (as sacreBLEU expects) from tokens; the word-internal splits of spaCy's
        tokenizer exceptions that Moses does not know are joined first (:func:`join_clitics`)."""
        # the unknown word as a word to Moses too, which leaves "l'" apart from a "<unk>" after it
        words = [_UNK_WORD if self.unk_word and tok == UNK_TEXT else tok for tok in tokens]
        text = self._moses(join_clitics(words, self.lang))
        if self.unk_word:
            text = text.replace(_UNK_WORD, UNK_TEXT)
        # Moses glues one "@-@" between words; of two in a row (an undertrained model's "a @-@ @-@ b")
        # it leaves the second as text, "a-@-@ b": a marker is never the output's text
        return text.replace(HYPHEN_MARKER, "-")

    def _moses(self, tokens: list[str]) -> str:
        """Moses' detokenization, which knows the apostrophe "'" (English "dog 's", French "l' été"
        are joined, and 'single quotes' paired) but not the typographic "’" and "‘", which it left
        apart: "dog ’s", "l’ été". So each is an "'" to it, and put back: Moses only places spaces,
        so the n-th apostrophe of its output is the n-th of the tokens."""
        if not any(c in tok for tok in tokens for c in _TYPOGRAPHIC):
            return self._detok.detokenize(tokens, unescape=False)
        kinds = [c for tok in tokens for c in tok if c == "'" or c in _TYPOGRAPHIC]
        text = self._detok.detokenize(["".join("'" if c in _TYPOGRAPHIC else c for c in tok) for tok in tokens],
                                      unescape=False)
        if text.count("'") != len(kinds):  # not seen; then spacing as before rather than a wrong character
            return self._detok.detokenize(tokens, unescape=False)
        marks = iter(kinds)
        return re.sub("'", lambda _: next(marks), text)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "version": _STATE_VERSION, "lang": self.lang, "lowercase": self.lowercase}


_THREAD = threading.local()  # the paper metric's spaCy pipelines built on this thread, by language


def _thread_pipeline(lang: str) -> spacy.tokenizer.Tokenizer:
    """``_blank_tokenizer(lang)``, built once a thread and kept for the thread's life. The paper
    metric's tokenizer is asked for at every evaluation (each run and split of reproduce and compare,
    the trainer's, ``score``), and ``spacy.blank`` cost 0.1-0.2 s each time. One a thread, not one
    for all: spaCy's tokenizer adds to its vocabulary and cache as it reads, in Python callbacks
    where another thread may run, and reproduce and compare score runs on several threads."""
    pipelines = _THREAD.__dict__.setdefault("pipelines", {})
    if (pipeline := pipelines.get(lang)) is None:
        pipeline = pipelines[lang] = _blank_tokenizer(lang)
    return pipeline


class _MetricTokenizer(SpacyTokenizer):
    """:class:`SpacyTokenizer` that tokenises with the calling thread's pipeline of its language
    (:func:`_thread_pipeline`): one made on a thread and used on another uses the other's."""

    def __init__(self, lang: str, lowercase: bool = False) -> None:
        super().__init__(lang, lowercase, unk_word=True, lazy=True)
        _thread_pipeline(lang)  # a language spaCy cannot tokenise is refused now

    @property
    def _tokenizer(self) -> spacy.tokenizer.Tokenizer:
        return _thread_pipeline(self.lang)


def metric_tokenizer(lang: str, lowercase: bool = False) -> SpacyTokenizer:
    """The tokenizer the COMET paper's metric (and BLEU by length) is computed with: spaCy's words
    of ``lang``, the text ``<unk>`` read as one word (``unk_word``). The paper scores the model's
    tokens, where the unknown word is one token; spaCy alone cut it into "<", "unk", ">" (three
    unmatched tokens) and glued it onto a neighbour ("<unk>-shirt" -> "<", "unk>-shirt", losing the
    match of "shirt"). Its spaCy pipeline is built once a thread (:func:`_thread_pipeline`).
    Raises :class:`DataError` where spaCy cannot tokenise ``lang``."""
    return _MetricTokenizer(lang, lowercase)


_WARNED_LOCK = threading.Lock()  # reproduce and compare score runs in threads (--jobs)
_warned: set[str] = set()  # the languages paper_tokenizer has warned of inside the open warn_once_a_language() blocks
_warning_scopes = 0  # how many warn_once_a_language() blocks are open


@contextmanager
def warn_once_a_language() -> Iterator[None]:
    """Inside this block (a call that scores many runs: reproduce, compare, their scoring threads
    included), :func:`paper_tokenizer` warns once a language, not once a run (and again for the
    bootstrap test). Blocks nest, an inner one adding to the outer's languages; two calls running
    at once in one process share them."""
    global _warning_scopes
    with _WARNED_LOCK:
        _warning_scopes += 1
    try:
        yield
    finally:
        with _WARNED_LOCK:
            _warning_scopes -= 1
            if not _warning_scopes:
                _warned.clear()


def paper_tokenizer(lang: str, lowercase: bool = False) -> SpacyTokenizer | None:
    """:func:`metric_tokenizer`, or None, with a warning that names why, where spaCy cannot
    tokenise ``lang`` (Japanese without SudachiPy, a language spaCy lacks): scores are then
    sacreBLEU's BLEU and chrF without the paper metric. Every call warns, but once a language
    inside :func:`warn_once_a_language`."""
    try:
        return metric_tokenizer(lang, lowercase=lowercase)
    except DataError as exc:
        with _WARNED_LOCK:
            first = not _warning_scopes or lang not in _warned
            if _warning_scopes:
                _warned.add(lang)
        if first:
            logger.warning("%s: scores are BLEU and chrF without the COMET paper's metric", exc)
        return None


# Every character str.isspace() knows but the space itself: spaCy takes each as a space (it separates
# words and is dropped, as _doc_tokens does), SentencePiece (identity normalization) as a character
# (listed: finding them among all code points took 0.3 s at import; a test checks the list)
OTHER_SPACES = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_AS_SPACE = str.maketrans(OTHER_SPACES, " " * len(OTHER_SPACES))


class SentencePieceTokenizer:
    """Subword tokenizer from a SentencePiece model kept as serialized proto bytes.

    Trained with the identity normalization and whitespace kept, so ``detokenize(tokenize(x)) == x``
    for any text made of characters seen in training, spaces the only whitespace.

    ``spaces_only``: every other whitespace character (a tab, a carriage return inside a line, a
    no-break space, ...) is a space, in training and tokenising alike, as spaCy's words take it.
    SentencePiece alone kept each as a character: a tab cut the next word into pieces without its
    word-start mark ("Zwei\tjunge" -> "▁Zwei", "\t", "j", "ung", "e"), and one its training text
    lacked was <unk>. Models trained before it (a state without the key) keep their characters, as
    they were trained on them.
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, lowercase: bool = False, *, spaces_only: bool = True) -> None:
        self.model_proto = bytes(model_proto)
        self.lowercase = lowercase
        self.spaces_only = spaces_only
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)

    @classmethod
    def train(
        cls,
        texts: list[str],
        vocab_size: int,
        model_type: Literal["unigram", "bpe"] = "unigram",
        character_coverage: float = 1.0,
        seed: int = 1,
        *,
        lowercase: bool = False,
    ) -> "SentencePieceTokenizer":
        """Train quietly and deterministically in memory; the vocabulary may end up smaller than asked."""
        texts = [_sentencepiece_text(t, lowercase, spaces_only=True) for t in texts]  # as tokenize reads them
        if not any(t.strip() for t in texts):
            raise DataError("cannot train a SentencePiece model: the training text is empty")
        proto = _train_sentencepiece(texts, vocab_size, model_type, character_coverage, seed)
        tok = cls(proto, lowercase=lowercase, spaces_only=True)
        logger.info(
            "trained SentencePiece %s model on %d sentences: %d pieces (asked %d)",
            model_type, len(texts), len(tok._sp), vocab_size,
        )
        return tok

    def _prepare(self, text: str) -> str:
        return _sentencepiece_text(text, self.lowercase, self.spaces_only)

    def tokenize(self, text: str) -> list[str]:
        """Pieces of one sentence; the text ``<unk>`` (as :meth:`detokenize` writes the unknown
        piece) is the unknown piece again, so ``logprob`` scores a translation holding it as the
        search did (SentencePiece itself cut it into "<", "unk", ">")."""
        text = self._prepare(text)
        if UNK_TEXT not in text:
            return self._sp.encode(text, out_type=str)
        parts = text.split(UNK_TEXT)
        pieces: list[str] = []
        for i, part in enumerate(parts):  # the space on each side of <unk> is the one detokenize puts there
            part = part[1:] if i and part.startswith(" ") else part
            part = part[:-1] if i < len(parts) - 1 and part.endswith(" ") else part
            pieces += ([UNK_TEXT] if i else []) + self._sp.encode(part, out_type=str)
        return pieces

    def tokenize_many(self, texts: Iterable[str]) -> list[list[str]]:
        """Pieces of many sentences (SentencePiece's batched encode)."""
        texts = [self._prepare(t) for t in texts]
        pieces = self._sp.encode(texts, out_type=str)
        return [self.tokenize(t) if UNK_TEXT in t else p for t, p in zip(texts, pieces)]

    def detokenize(self, tokens: list[str]) -> str:
        """Text from pieces. The unknown piece (a piece the model's vocabulary lacks, e.g. past
        ``data.max_vocab``) is written ``<unk>``, as a word: SentencePiece wrote " ⁇ " with a
        double space after it ("a ⁇  dog"), which ``logprob`` and ``replace_unk``'s readers could not
        take for the unknown word."""
        tokens = list(tokens)
        if UNK_TEXT not in tokens:
            return self._sp.decode_pieces(tokens)
        text, segment = "", []
        for tok in [*tokens, None]:  # None flushes the last segment
            if tok is not None and tok != UNK_TEXT:
                segment.append(tok)
                continue
            if segment:  # a piece starting a word (U+2581) is spaced from what is before it
                text += (" " if text and segment[0].startswith("\u2581") else "") + self._sp.decode_pieces(segment)
                segment = []
            if tok == UNK_TEXT:
                text += (" " if text and not text.endswith(" ") else "") + UNK_TEXT
        return text

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "version": _STATE_VERSION,
            "model_proto": self.model_proto,
            "lowercase": self.lowercase,
            "spaces_only": self.spaces_only,
        }


def _sentencepiece_text(text: str, lowercase: bool, spaces_only: bool) -> str:
    """The text a SentencePiece model is trained on and reads: lowercased if asked, and with
    ``spaces_only`` every whitespace character a space (see :class:`SentencePieceTokenizer`)."""
    text = text.lower() if lowercase else text
    return text.translate(_AS_SPACE) if spaces_only else text




def _train_sentencepiece(
    texts: list[str], vocab_size: int, model_type: str, character_coverage: float, seed: int
) -> bytes:
    """Run SentencePieceTrainer on ``texts`` and return the serialized model proto."""
    spm.set_random_generator_seed(seed)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buf,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            hard_vocab_limit=False,  # small corpora may not support vocab_size pieces
            # the trainer skips, without a word, a sentence longer than this (4192 bytes by default)
            max_sentence_length=max([4192, *(len(t.encode("utf-8")) for t in texts)]),
            normalization_rule_name="identity",  # keep text byte-exact for lossless round trips
            remove_extra_whitespaces=False,
            bos_id=-1,  # BOS/EOS/PAD are handled by cometnmt's Vocab
            eos_id=-1,
            pad_id=-1,
            num_threads=_SP_THREADS,
            minloglevel=2,  # errors only: training is quiet
        )
    except RuntimeError as exc:
        kind = VocabSizeError if "Vocabulary size" in str(exc) else DataError  # too small for the text's characters
        raise kind(
            f"SentencePiece training ({model_type}, vocab_size={vocab_size}) on {len(texts)} sentences "
            f"failed: {exc}"
        ) from None
    return buf.getvalue()


def tokenizer_from_state(state: dict, *, lazy: bool = False) -> Tokenizer:
    """Rebuild a tokenizer from its ``state_dict``; ``lazy``: a spaCy tokenizer builds its
    pipeline on first use (:class:`SpacyTokenizer`), for a side that may never be tokenized."""
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind == SpacyTokenizer.kind:
        return SpacyTokenizer(state["lang"], lowercase=bool(state.get("lowercase", False)), unk_word=True, lazy=lazy)
    if kind == SentencePieceTokenizer.kind:
        return SentencePieceTokenizer(state["model_proto"], lowercase=bool(state.get("lowercase", False)),
                                      spaces_only=bool(state.get("spaces_only", False)))  # older: as trained
    raise DataError(
        f"unknown tokenizer kind {kind!r} in saved tokenizer state; expected 'spacy' or 'sentencepiece' "
        "(the checkpoint may come from an incompatible cometnmt version)"
    )


def build_tokenizer(
    kind: Literal["spacy", "sentencepiece"],
    lang: str,
    train_texts: list[str],
    *,
    lowercase: bool,
    sp_vocab_size: int,
    sp_model_type: str,
) -> Tokenizer:
    """A spaCy tokenizer for ``lang``, or a SentencePiece model trained on ``train_texts``."""
    if kind == "spacy":
        return SpacyTokenizer(lang, lowercase=lowercase, unk_word=True)
    if kind == "sentencepiece":
        return SentencePieceTokenizer.train(
            train_texts, sp_vocab_size, model_type=sp_model_type, lowercase=lowercase  # type: ignore[arg-type]
        )
    raise DataError(f"unknown tokenizer {kind!r}; choose 'spacy' or 'sentencepiece'")
