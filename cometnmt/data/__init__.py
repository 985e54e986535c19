"""Data pipeline: reading corpora, Multi30k, tokenizers, vocabularies and batching.

The names below are imported on first use (PEP 562), as the package's own exports are: importing
one light submodule (``cometnmt.data.corpus``, which the CLI's reproduce/compare options pull in)
must not import torch (batching) and spaCy (tokenizers), ~6 s of every ``cometnmt --help``."""

from cometnmt.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["Batch", "collate", "make_batches", "padding_fraction"], "cometnmt.data.batching"),
    **dict.fromkeys(["ParallelCorpus", "read_lines", "read_parallel"], "cometnmt.data.corpus"),
    **dict.fromkeys(["DEFAULT_URL", "ENV_VAR", "LANGS", "SHA256", "SPLITS", "file_name", "resolve_dir", "split_paths"],
                    "cometnmt.data.multi30k"),
    **dict.fromkeys(["SentencePieceTokenizer", "SpacyTokenizer", "Tokenizer", "build_tokenizer", "tokenizer_from_state"],
                    "cometnmt.data.tokenizers"),
    **dict.fromkeys(["BOS", "EOS", "PAD", "SPECIALS", "UNK", "Vocab"], "cometnmt.data.vocab"),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("cometnmt.data", globals(), _EXPORTS)
