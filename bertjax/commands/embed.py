"""`bertjax embed --model DIR --input FILE --output FILE.npy`: one embedding per input text, in input order.

DIR: a sentence-transformers directory (modules.json: pooling, Dense, Normalize, prompts) or any model directory
`bertjax.model_dirs.load_model_dir` reads (mean pooling then, as sentence-transformers wraps a plain model).
FILE: a text file with one text per line (an empty line is the empty text and gets its embedding), or a JSONL /
CSV / TSV / Parquet file with the texts in `--column` (default "text"); see bertjax/embeddings/corpus.py.
The output is float32 [texts, dim] in FILE.npy, described by FILE.json (model, fingerprint, dim, count, input),
which `bertjax search` reads. Texts go through bertjax.embeddings.Embedder: packed rows, shape buckets, a token
budget per batch, bf16 compute on accelerators, every local device.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bertjax.commands.model_args import add_allow_pickle

HELP = "embed a file of texts with a sentence-embedding model into FILE.npy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a sentence-transformers or model directory")
    parser.add_argument("--input", required=True, metavar="FILE",
                        help="texts: one per line, or .jsonl/.csv/.tsv/.parquet with --column")
    parser.add_argument("--output", required=True, metavar="FILE.npy", help="where the float32 embeddings go")
    add_embedding_arguments(parser)
    parser.add_argument("--column", default="text", help="column of the texts in a JSONL/CSV/TSV/Parquet input")
    parser.add_argument("--errors", choices=("strict", "replace"), default="strict",
                        help="bytes that are not UTF-8: an error (strict, default) or U+FFFD (replace)")
    parser.add_argument("--prompt-name", metavar="NAME", help="one of the model's prompts, e.g. document")
    parser.add_argument("--prompt", metavar="TEXT", help="a prefix for every text, e.g. 'search_document: '")


def add_embedding_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `embed` and `search` (the query must be embedded as the corpus was)."""
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="token budget of one batch (default 2048 on CPU, where big batches spill the caches; "
                             "16384 on GPU/TPU)")
    parser.add_argument("--max-segments", type=int, default=32,
                        help="texts packed into one row at most (1: no packing; default 32)")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="compute dtype of the encoder (auto: bfloat16 on GPU/TPU, float32 on CPU); pooling "
                             "and outputs are float32")
    parser.add_argument("--overflow", choices=("truncate", "chunk"), default="truncate",
                        help="texts longer than the model: truncate (default) or embed overlapping chunks and "
                             "average them")
    parser.add_argument("--stride", type=int, default=0,
                        help="with --overflow chunk: tokens shared by neighbours (default 0)")
    parser.add_argument("--truncate-dim", type=int, metavar="N", help="Matryoshka: keep the first N dimensions")
    parser.add_argument("--normalize", action="store_true", help="L2-normalise embeddings (if the model does not)")
    add_allow_pickle(parser)


def load_embedder(args: argparse.Namespace):
    from bertjax.embeddings import Embedder, load_sentence_encoder

    if args.max_tokens is not None and args.max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    if args.max_segments <= 0:
        raise ValueError(f"--max-segments must be positive, got {args.max_segments}")
    if args.stride and args.overflow != "chunk":
        raise ValueError(f"--stride {args.stride} applies to --overflow chunk (the overlap of a long text's chunks); "
                         f"with --overflow {args.overflow} there are no chunks")
    encoder = load_sentence_encoder(args.model, allow_pickle=args.allow_pickle)
    changes = {}
    if args.truncate_dim is not None:
        changes["truncate_dim"] = args.truncate_dim
    if args.normalize:
        changes["normalize"] = True
    if changes:
        encoder = encoder.replace(pooling=encoder.pooling.replace(**changes))  # checks truncate_dim <= dim
    return Embedder(encoder, max_tokens=args.max_tokens, max_segments=args.max_segments,
                    dtype=args.dtype, overflow=args.overflow, stride=args.stride)


def run(args: argparse.Namespace) -> int:
    from bertjax.embeddings.corpus import check_output_paths, model_fingerprint, read_texts, write_embeddings
    from bertjax.file_digest import sha256_of

    output = Path(args.output)
    check_output_paths(output, args.input)  # before the model loads: never overwrite the input or a user's FILE.json
    texts, replaced = read_texts(args.input, args.column, args.errors)
    input_digest = sha256_of(args.input)  # of the file as read, before the minutes embedding may take
    embedder = load_embedder(args)
    prompt = embedder.encoder.resolve_prompt(args.prompt_name, args.prompt)
    if replaced:
        print(f"{args.input}: {replaced} byte sequence(s) that are not UTF-8 read as U+FFFD", file=sys.stderr)
    if not texts:
        print(f"{args.input}: no texts; writing an empty [0, {embedder.dim}] matrix", file=sys.stderr)
    start = time.perf_counter()
    vectors = embedder.embed(texts, prompt=prompt)
    seconds = time.perf_counter() - start
    encoder = embedder.encoder
    write_embeddings(output, vectors, {
        "model": str(Path(args.model).resolve()),
        "model_fingerprint": model_fingerprint(encoder),
        "input": str(Path(args.input).resolve()),
        "input_sha256": input_digest,  # what `search` checks before showing this file's texts
        "column": None if Path(args.input).suffix.lower() not in (".jsonl", ".json", ".csv", ".tsv", ".parquet")
        else args.column,
        "prompt": prompt,
        "normalized": bool(encoder.pooling.normalize),
        "truncate_dim": encoder.pooling.truncate_dim,
        "similarity_fn_name": encoder.similarity_fn_name,
        "overflow": args.overflow,
        "stride": args.stride,
        "max_seq_length": encoder.max_seq_length,
    })
    rate = f" in {seconds:.1f}s ({len(texts) / seconds:.0f} texts/s)" if texts and seconds > 0 else ""
    print(f"{len(texts)} embeddings of dimension {embedder.dim}{rate} -> {output}")
    return 0
