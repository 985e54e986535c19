"""Data pipeline: reading corpora, Multi30k, tokenizers, vocabularies and batching."""

from cometnmt.data.batching import Batch, collate, make_batches, padding_fraction
from cometnmt.data.corpus import ParallelCorpus, read_lines, read_parallel
from cometnmt.data.multi30k import (
    DEFAULT_URL,
    ENV_VAR,
    LANGS,
    SHA256,
    SPLITS,
    file_name,
    resolve_dir,
    split_paths,
)
from cometnmt.data.tokenizers import (
    SentencePieceTokenizer,
    SpacyTokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_state,
)
from cometnmt.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab

__all__ = [
    "BOS",
    "Batch",
    "DEFAULT_URL",
    "ENV_VAR",
    "EOS",
    "LANGS",
    "PAD",
    "ParallelCorpus",
    "SHA256",
    "SPECIALS",
    "SPLITS",
    "SentencePieceTokenizer",
    "SpacyTokenizer",
    "Tokenizer",
    "UNK",
    "Vocab",
    "build_tokenizer",
    "collate",
    "file_name",
    "make_batches",
    "padding_fraction",
    "read_lines",
    "read_parallel",
    "resolve_dir",
    "split_paths",
    "tokenizer_from_state",
]
