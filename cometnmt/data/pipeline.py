"""From a DataConfig to token ids and back: corpora -> tokenizers -> vocabularies -> examples.

:class:`TextCodec` bundles both sides' tokenizers and vocabularies. It is what a checkpoint stores
(``state_dict``), so ``translate`` needs nothing but the checkpoint file.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from cometnmt.config import DATA_PATH_KEYS
from cometnmt.data.corpus import ParallelCorpus, blank_tail, read_lines, read_parallel
from cometnmt.data.multi30k import LANGS, resolve_dir, split_paths
from cometnmt.data.tokenizers import (Tokenizer, UnknownLanguageError, VocabSizeError, build_tokenizer,
                                       tokenizer_from_state)
from cometnmt.data.vocab import BOS, EOS, UNK, Vocab
from cometnmt.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class TextCodec:
    """Text <-> ids for one translation direction."""

    src_tok: Tokenizer
    tgt_tok: Tokenizer
    src_vocab: Vocab
    tgt_vocab: Vocab
    src_sos_eos: bool = False  # COMET "source SOS/EOS" variant

    def encode_src(self, tokens: list[str]) -> list[int]:
        ids = self.src_vocab.encode(tokens)
        return [BOS] + ids + [EOS] if self.src_sos_eos else ids

    def encode_tgt(self, tokens: list[str]) -> list[int]:
        return self.tgt_vocab.encode(tokens)

    def decode_tgt(self, ids: list[int]) -> str:
        return self.tgt_tok.detokenize(self.tgt_vocab.decode(ids))

    def state_dict(self) -> dict:
        return {
            "src_tok": self.src_tok.state_dict(),
            "tgt_tok": self.tgt_tok.state_dict(),
            "src_vocab": self.src_vocab.to_dict(),
            "tgt_vocab": self.tgt_vocab.to_dict(),
            "src_sos_eos": self.src_sos_eos,
        }

    @classmethod
    def from_state(cls, state: dict) -> "TextCodec":
        """The codec a checkpoint keeps. Translating tokenizes the source and only detokenizes the
        target, which needs no spaCy pipeline: the target's is built where a target is first
        tokenized (logprob, training), not here (``spacy.blank``, 0.1-0.2 s of every start-up)."""
        return cls(
            tokenizer_from_state(state["src_tok"]),
            tokenizer_from_state(state["tgt_tok"], lazy=True),
            Vocab.from_dict(state["src_vocab"]),
            Vocab.from_dict(state["tgt_vocab"]),
            bool(state["src_sos_eos"]),
        )


@dataclass
class Examples:
    """Encoded pairs of one split, aligned with the raw text they came from."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    src_text: list[str]
    tgt_text: list[str]
    src_tags: dict[str, list[list[int]]] | None = None  # Transformer++: task -> tag ids per source token (data/tagging.py)
    src_taggers: dict[str, str] | None = None  # Transformer++: task -> the annotator that tagged (name and version)

    def __len__(self) -> int:
        return len(self.src_ids)


def split_files(cfg, split: str) -> tuple[Path, Path]:
    """Source and target file of a split ('train' | 'valid' | 'test') for a DataConfig ("~" is the
    home folder, as ``anchor_paths`` takes it)."""
    if cfg.corpus == "files":
        src, tgt = getattr(cfg, f"{split}_src"), getattr(cfg, f"{split}_tgt")
        if src is None or tgt is None:
            raise DataError(f"config keys 'data.{split}_src' and 'data.{split}_tgt' must name files for the {split} split",
                            keys=(f"data.{split}_src", f"data.{split}_tgt"))
        paths = Path(src).expanduser(), Path(tgt).expanduser()
        for side, path in zip(("src", "tgt"), paths):
            if not path.exists():  # name the key, and the folder a relative path was taken from
                where = "" if path.is_absolute() else f" (relative paths are taken from the current folder, {Path.cwd()})"
                raise DataError(f"config key 'data.{split}_{side}': {path}: file not found{where}", keys=(f"data.{split}_{side}",))
            if path.is_dir():
                raise DataError(f"config key 'data.{split}_{side}': {path}: is a folder, expected a text file",
                                keys=(f"data.{split}_{side}",))
        return paths
    name = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}[split]
    for key in ("src_lang", "tgt_lang"):
        if getattr(cfg, key) not in LANGS:
            raise DataError(f"config key 'data.{key}': {getattr(cfg, key)!r} is not a language of Multi30k task 1 that "
                            f"this package knows; expected one of {', '.join(LANGS)} (other files: data.corpus: files)",
                            keys=(f"data.{key}", "data.corpus"))
    files = [f"{name}.{cfg.src_lang}.gz", f"{name}.{cfg.tgt_lang}.gz"]
    try:
        root = resolve_dir(cfg.multi30k_dir, files=files, key="config key 'data.multi30k_dir'")
    except DataError as exc:  # the key, where set, for name_origin (a download's errors name none)
        if not cfg.multi30k_dir or exc.keys:
            raise
        raise DataError(str(exc), keys=("data.multi30k_dir",)) from None
    return split_paths(root, name, cfg.src_lang, cfg.tgt_lang)


def anchor_paths(cfg, workdir: str | None):
    """A copy of DataConfig ``cfg`` whose relative file and folder paths are taken relative to
    ``workdir`` (the folder a run was trained in), so a checkpoint finds its data from anywhere."""
    if workdir is None:
        return cfg
    changes = {k: str(Path(workdir) / v) for k in DATA_PATH_KEYS
               if (v := getattr(cfg, k)) is not None and not Path(v).expanduser().is_absolute()}
    return dataclasses.replace(cfg, **changes)


def _check_not_one_tsv(corpus: ParallelCorpus, split: str) -> None:
    """A tab-separated file of pairs (JoeyNMT's and Marian's format) named as both sides of a split
    was read as two copies of its lines: the run trained a model to copy "source<TAB>target" lines,
    without a word. Sides holding the same lines, each with a tab, are refused, and so is one side
    whose every line holds a tab; the same file without tabs (a copy task) is read as before. Text
    whose tabs are its own (code, table rows) in every line goes through with ``data.tabs_are_text``
    (:func:`read_split` does not call this then), which the errors name."""
    cut = (f"give one file per language, line-aligned (cut -f1 FILE > {split}.SRC; cut -f2 FILE > {split}.TGT); "
           "if the tabs are part of the text (code, table rows), set data.tabs_are_text: true")
    if corpus.src and corpus.src == corpus.tgt and all("\t" in line for line in corpus.src):
        raise DataError(
            f"config keys 'data.{split}_src' and 'data.{split}_tgt': {corpus.src_path} and {corpus.tgt_path} hold the "
            f"same lines, each with a tab: a tab-separated file of pairs is not read as two columns; {cut}",
            keys=(f"data.{split}_src", f"data.{split}_tgt"))
    # named as one side beside a file of the other language, it trained "source<TAB>target" lines as
    # that side's sentences without a word (the line counts agreed)
    for side, path, lines in (("src", corpus.src_path, corpus.src), ("tgt", corpus.tgt_path, corpus.tgt)):
        if lines and all("\t" in line for line in lines):
            raise DataError(
                f"config key 'data.{split}_{side}': every line of {path} holds a tab: a tab-separated file of pairs "
                f"is not read as two columns (each whole line would be one sentence); {cut}", keys=(f"data.{split}_{side}",))


def read_split(cfg, split: str) -> ParallelCorpus:
    """Training skips empty pairs (``read_parallel`` logs their count and first line); evaluation
    splits reject them. A split of one's own corpus (``data.corpus: files``) cut by
    ``data.max_train_pairs`` or ``max_valid_pairs`` is a warning naming the key and what was left
    unread: a config built on ``configs/tiny.yaml`` (2,000 and 100 pairs) trained on that much of a
    user's own corpus, the log saying only how many pairs. Multi30k's, cut so, is an INFO line:
    a slice of the benchmark is what tiny.yaml and smoke runs ask for, and every such run warned."""
    src, tgt = split_files(cfg, split)
    key = {"train": "max_train_pairs", "valid": "max_valid_pairs"}.get(split)
    limit = getattr(cfg, key) if key else None
    corpus = read_parallel(src, tgt, empty="skip" if split == "train" else "error", max_pairs=limit)
    if not cfg.tabs_are_text:
        _check_not_one_tsv(corpus, split)
    if corpus.not_read:
        level = logging.WARNING if cfg.corpus == "files" else logging.INFO
        log.log(level, "%s / %s: the first %d %s pairs only (data.%s=%d); %d line pairs after them left unread",
                src, tgt, len(corpus), split, key, limit, corpus.not_read)
    return corpus


def warn_training_pairs_in(train: ParallelCorpus, held_out: ParallelCorpus, split: str) -> None:
    """Warn of the pairs of an evaluation split that the training split holds too (the same two
    sentences, spaces at their ends aside). A corpus cut into training and dev files without
    deduplicating first scores such pairs by what the model memorised, its dev BLEU and early
    stopping with them, and nothing said so.
    Multi30k's val and test share no pair with its train. The set holds the (small) evaluation
    split, not the training one; evaluation splits keep every line, so a pair's index is its line."""
    lines = {}  # (source, target) -> the lines of the evaluation split holding it
    for i, (s, t) in enumerate(zip(held_out.src, held_out.tgt), start=1):
        lines.setdefault((s.strip(), t.strip()), []).append(i)
    shared = set()
    for s, t in zip(train.src, train.tgt):
        shared.update(lines.get((s.strip(), t.strip()), ()))
    if shared:
        log.warning("%s / %s: %d of the %d %s pairs %s too (first: line %d): their scores measure what the model "
                    "memorised; remove them from the training files (or the %s files)", held_out.src_path,
                    held_out.tgt_path, len(shared), len(held_out), split,
                    "is a training pair" if len(shared) == 1 else "are training pairs", min(shared), split)


def too_long(src_tokens: list[str], tgt_tokens: list[str], max_len: int | None) -> bool:
    """Whether a training pair is dropped at ``data.max_len``: more tokens than it on either side
    (the tokenizer's tokens, before <s> </s> are added). One test for :func:`build_codec`, which
    counts the vocabularies on the pairs kept, and :func:`encode_pairs`, which drops the others."""
    return max_len is not None and (len(src_tokens) > max_len or len(tgt_tokens) > max_len)


VOCAB_COUNT = "pairs kept at data.max_len"
"""What :func:`build_codec` counts the vocabularies on (every pair before 2026-11-29): part of the
key of a cache of encoded data (bench.py ``--data-cache``, bench_convs2s.py ``--ids``), so that
one written under the other rule is rebuilt, not read with its vocabularies."""


def build_codec(cfg, train: ParallelCorpus) -> tuple[TextCodec, list[list[str]], list[list[str]]]:
    """Fit tokenizers and vocabularies on the training split; also return its tokens (every pair's,
    in the corpus's order, as :func:`encode_pairs` takes them).

    The vocabularies (and ``data.min_freq``'s counts) are counted on the pairs training keeps, those
    of at most ``data.max_len`` tokens a side, as JoeyNMT builds its vocabulary from the filtered
    training data: a word seen only in a dropped pair had a row of its own that no gradient reached
    (an untrained embedding, and an output the softmax kept but no target ever asked for), and counted
    towards another word's ``min_freq``. The order is fit the tokenizer, tokenise, filter, count: the
    filter counts tokens, so it needs the tokenizer first. spaCy's word tokenizer learns nothing.
    A SentencePiece model is trained on every pair of the split: the pairs it keeps are measured in
    its own pieces, and one retrained on the kept pairs would cut them otherwise (moving pairs across
    ``data.max_len``) at twice the fitting time; the pieces seen only in dropped pairs are left out
    of the vocabulary (``<unk>``) all the same, so no row goes untrained."""
    def fit(key: str, lang: str, texts: list[str]):
        try:
            return build_tokenizer(cfg.tokenizer, lang, texts, lowercase=cfg.lowercase, sp_vocab_size=cfg.sp_vocab_size,
                                   sp_model_type=cfg.sp_model_type)
        except VocabSizeError as exc:  # too small for the characters of the text, say
            raise DataError(f"config key 'data.sp_vocab_size' ({lang}): {exc}", keys=("data.sp_vocab_size",)) from None
        except UnknownLanguageError as exc:  # a language spaCy lacks
            raise DataError(f"config key 'data.{key}': {exc}; data.tokenizer=sentencepiece tokenises any language",
                            keys=(f"data.{key}", "data.tokenizer")) from None

    src_tok, tgt_tok = fit("src_lang", cfg.src_lang, train.src), fit("tgt_lang", cfg.tgt_lang, train.tgt)
    src_tokens, tgt_tokens = src_tok.tokenize_many(train.src), tgt_tok.tokenize_many(train.tgt)
    kept = [i for i, (s, t) in enumerate(zip(src_tokens, tgt_tokens)) if not too_long(s, t, cfg.max_len)]
    min_freq = cfg.min_freq if cfg.tokenizer == "spacy" else 1
    codec = TextCodec(
        src_tok,
        tgt_tok,
        Vocab.build((src_tokens[i] for i in kept), min_freq=min_freq, max_size=cfg.max_vocab),
        Vocab.build((tgt_tokens[i] for i in kept), min_freq=min_freq, max_size=cfg.max_vocab),
        cfg.src_sos_eos,
    )
    log.info("vocabularies: %s %d, %s %d types", cfg.src_lang, len(codec.src_vocab), cfg.tgt_lang, len(codec.tgt_vocab))
    return codec, src_tokens, tgt_tokens


def encode_pairs(
    codec: TextCodec,
    corpus: ParallelCorpus,
    max_len: int | None,
    tokens: tuple[list[list[str]], list[list[str]]] | None = None,
) -> Examples:
    """Tokenise and index a corpus; pairs longer than ``max_len`` on either side are dropped (training)."""
    src_tokens, tgt_tokens = tokens or (codec.src_tok.tokenize_many(corpus.src), codec.tgt_tok.tokenize_many(corpus.tgt))
    out = Examples([], [], [], [])
    over = [0, 0]  # pairs over max_len on the source side, on the target side (a pair may count in both)
    dropped = 0
    for s_tok, t_tok, s_txt, t_txt in zip(src_tokens, tgt_tokens, corpus.src, corpus.tgt):
        if too_long(s_tok, t_tok, max_len):
            dropped += 1
            over[0] += len(s_tok) > max_len
            over[1] += len(t_tok) > max_len
            continue
        out.src_ids.append(codec.encode_src(s_tok))
        out.tgt_ids.append(codec.encode_tgt(t_tok))
        out.src_text.append(s_txt)
        out.tgt_text.append(t_txt)
    if dropped:
        # both files named: the target side's sentences (or its tokenizer) may be the long ones
        log.info("%s / %s: dropped %d pairs longer than data.max_len=%d tokens (%d over it on the source side, "
                 "%d on the target side)", corpus.src_path, corpus.tgt_path, dropped, max_len, *over)
    return out


def unknown_share(ids: list[list[int]]) -> float:
    """The share of tokens a vocabulary lacks (``<unk>``) in indexed sentences, 0 for none."""
    total = sum(len(row) for row in ids)
    return sum(row.count(UNK) for row in ids) / total if total else 0.0


def read_text_file(path: str | Path) -> list[str]:
    """Monolingual input for translation/evaluation: every line must be non-empty."""
    lines = read_lines(path)
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            tail = blank_tail(lines, i)
            raise DataError(f"{path}:{i}: empty line{' (' + tail + ')' if tail else ''}")
    return lines
