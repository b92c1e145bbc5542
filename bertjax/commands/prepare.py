"""`bertjax prepare`: tokenize a corpus once into ArrayRecord files (see `bertjax.data.prepare`).

    bertjax prepare --input default --train-tokenizer --vocab-size 8192 --out data/pydoc
    bertjax prepare --input 'corpus/*.jsonl' --text-field text --tokenizer hf_checkpoint_dir --out data/web

Train with `DataConfig(input="data/pydoc")` and the tokenizer in `data/pydoc/tokenizer`. `--out` and the inputs
may be on a bucket (`gs://...`), as `data.input` of `bertjax pretrain` may.
"""

from __future__ import annotations

import argparse
import tempfile

HELP = "tokenize a corpus (default, text, JSONL, Parquet) once into ArrayRecord files for pretraining"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bertjax.data.tokenizer_training import DEFAULT_VOCAB_SIZE, MODEL_TYPES

    parser.add_argument("--input", default="default",
                        help="'default' (the embedded Python documentation corpus) or comma-separated files, "
                             "directories and globs of .txt/.jsonl/.parquet (default: default)")
    tokenizer = parser.add_mutually_exclusive_group(required=True)
    tokenizer.add_argument("--tokenizer", metavar="PATH",
                           help="tokenizer file or directory (tokenizer.json, *.model, vocab.txt)")
    tokenizer.add_argument("--train-tokenizer", action="store_true",
                           help="train a SentencePiece tokenizer on the input's train split first")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help=f"vocabulary size with --train-tokenizer (default {DEFAULT_VOCAB_SIZE})")
    parser.add_argument("--model-type", choices=MODEL_TYPES, default="bpe",
                        help="SentencePiece model with --train-tokenizer (default bpe: trains in seconds)")
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write")
    parser.add_argument("--text-format", choices=("lines", "paragraphs"), default="lines",
                        help=".txt files: one document per line (default), or blank-line separated documents")
    parser.add_argument("--text-field", default="text", help="JSONL/Parquet field holding the text (default text)")
    parser.add_argument("--eval-fraction", type=float, default=0.02,
                        help="fraction of documents held out for evaluation, by text hash (default 0.02)")
    parser.add_argument("--documents-per-file", type=int, default=100_000,
                        help="documents per ArrayRecord file (default 100000)")
    parser.add_argument("--overwrite", action="store_true", help="replace prepared data already in --out")


def run(args: argparse.Namespace) -> int:
    from bertjax.data.prepare import check_output_dir, prepare_corpus
    from bertjax.data.sources import open_documents
    from bertjax.data.tokenizer_training import train_sentencepiece
    from bertjax.data.tokenizers import load_tokenizer

    _check_arguments(args)  # before training a tokenizer, which takes a while
    check_output_dir(args.out, args.overwrite)  # before training a tokenizer: nothing in --out changes on refusal
    if args.train_tokenizer:
        train = open_documents(args.input, split="train", text_format=args.text_format, text_field=args.text_field,
                               eval_fraction=args.eval_fraction)
        if train.tokenized:
            raise ValueError(f"{args.input!r} is already prepared data")
        documents = (train[i] for i in _sample(len(train)))
        with tempfile.TemporaryDirectory(prefix="bertjax-tokenizer-") as scratch:
            # prepare_corpus saves the tokenizer into --out with the data (which may be a bucket)
            tokenizer = train_sentencepiece(documents, scratch, vocab_size=args.vocab_size, model_type=args.model_type)
        fewer = tokenizer.vocab_size < args.vocab_size
        print(f"trained a {args.model_type} SentencePiece tokenizer, vocabulary {tokenizer.vocab_size}"
              + (f": fewer than the {args.vocab_size} asked for, the most this corpus yields (SentencePiece's "
                 "hard_vocab_limit is off)" if fewer else ""))
    else:
        tokenizer = load_tokenizer(args.tokenizer)
    metadata = prepare_corpus(args.input, tokenizer, args.out, text_format=args.text_format, text_field=args.text_field,
                              eval_fraction=args.eval_fraction, documents_per_file=args.documents_per_file,
                              overwrite=args.overwrite)
    for split, info in metadata["splits"].items():
        print(f"{split}: {info['documents']} documents, {info['tokens']} tokens in {len(info['files'])} files")
    stats = metadata["source_stats"]
    if stats["skipped"] or stats["empty_after_tokenization"]:
        print(f"skipped: {stats['skipped']}, empty after tokenization: {stats['empty_after_tokenization']}"
              + (f"; e.g. {'; '.join(stats['examples'])}" if stats.get("examples") else ""))
    print(f"wrote {args.out}")
    return 0


def _check_arguments(args: argparse.Namespace) -> None:
    if args.documents_per_file <= 0:
        raise ValueError(f"--documents-per-file must be positive, got {args.documents_per_file}")
    if not 0.0 <= args.eval_fraction < 1.0:
        raise ValueError(f"--eval-fraction must be in [0, 1), got {args.eval_fraction}")
    if args.train_tokenizer and args.vocab_size <= 0:
        raise ValueError(f"--vocab-size must be positive, got {args.vocab_size}")


# At most this many documents (evenly spread over the corpus) train the tokenizer: seconds, not hours.
_TOKENIZER_DOCUMENTS = 200_000


def _sample(count: int) -> range:
    return range(0, count, max(1, count // _TOKENIZER_DOCUMENTS))
