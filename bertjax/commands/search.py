"""`bertjax search --model DIR --corpus FILE.npy --query "..." [-k 10]`: exact top-k search of a saved embedding
matrix (`bertjax embed` output).

The query is embedded by DIR (with the model's "query" prompt when it has one, or --prompt-name / --prompt), then
compared with every corpus row: cosine by default, jitted and chunked over the corpus (bertjax/embeddings/search.py)
so memory stays bounded. FILE.json (written by `bertjax embed`) names the texts shown next to each hit and the model
that embedded the corpus: a query embedded by another model is refused (dimension mismatch, or another model's
fingerprint; --allow-other-model to search anyway when the dimensions agree). The query is truncated
(truncate_dim) and normalised as FILE.json says the corpus was. Corpus rows holding NaN are never shown (a warning
counts them). FILE.json's texts file is read only when it has the sha256 FILE.json records (or, for a FILE.json
that records none, lies in the corpus's folder): a shared corpus's FILE.json cannot make search print another file
of the user's.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from bertjax.commands.embed import add_embedding_arguments

HELP = "exact top-k search (cosine or dot) of a query over embeddings saved by `bertjax embed`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="the model that embedded the corpus")
    parser.add_argument("--corpus", required=True, metavar="FILE.npy", help="embeddings written by bertjax embed")
    parser.add_argument("--query", required=True, action="append", metavar="TEXT",
                        help="a query (repeat for several)")
    parser.add_argument("-k", "--top-k", dest="k", type=int, default=10, help="hits per query (default 10)")
    parser.add_argument("--texts", metavar="FILE", help="the corpus texts to show (default: FILE.json's input)")
    parser.add_argument("--column", help="column of the texts in --texts (default: FILE.json's, else 'text')")
    parser.add_argument("--prompt-name", metavar="NAME", help="prompt for the query (default: the model's 'query')")
    parser.add_argument("--prompt", metavar="TEXT", help="a prefix for the query, e.g. 'search_query: '")
    parser.add_argument("--similarity", choices=("cosine", "dot"), default=None,
                        help="how hits are ranked (default: the model's similarity_fn_name, as FILE.json records "
                             "it, when it is cosine or dot; else cosine)")
    parser.add_argument("--chunk-size", type=int, default=32768, help="corpus rows per jitted step (default 32768)")
    parser.add_argument("--allow-other-model", action="store_true",
                        help="search even when FILE.json names another model of the same dimension")
    parser.add_argument("--json", action="store_true", help="print one JSON object per query")
    add_embedding_arguments(parser)


def load_corpus(path: str | Path):
    import numpy as np

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--corpus {path} is a directory; give the FILE.npy that `bertjax embed` wrote")
    if not path.is_file():
        raise FileNotFoundError(f"--corpus {path} does not exist")
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":  # else numpy tries it as a pickle and says so
            raise ValueError(f"--corpus {path}: not a .npy embedding matrix (no NumPy header)")
    try:
        corpus = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, OSError) as error:  # numpy's own text would advise loading a pickle
        reason = "it holds Python objects" if "pickle" in str(error) else str(error) or type(error).__name__
        raise ValueError(f"--corpus {path}: not a .npy embedding matrix ({reason})") from None
    if corpus.ndim != 2:
        raise ValueError(f"--corpus {path}: expected a [texts, dim] matrix, got shape {corpus.shape}")
    if corpus.shape[0] == 0:
        raise ValueError(f"--corpus {path}: the corpus is empty (0 embeddings); nothing to search")
    return corpus


def fingerprint_mismatch(args: argparse.Namespace, description: dict, encoder) -> str:
    """Why the corpus's fingerprint is not the query model's: another model, or the same directory with other
    settings (named when FILE.json records them)."""
    recorded_model = description.get("model")
    same_directory = recorded_model is not None and Path(recorded_model).resolve() == Path(args.model).resolve()
    if not same_directory:
        return (f"--corpus {args.corpus} was embedded by another model ({recorded_model}, fingerprint "
                f"{description['model_fingerprint']}) than --model {args.model}; its scores would mean nothing. "
                "Embed the corpus with this model, or pass --allow-other-model")
    now = {"normalized": bool(encoder.pooling.normalize), "truncate_dim": encoder.pooling.truncate_dim,
           "max_seq_length": encoder.max_seq_length}
    differences = [f"{key} {description[key]!r} (now {value!r})" for key, value in now.items()
                   if key in description and description[key] != value]
    what = ("other settings: " + ", ".join(differences) if differences
            else "other weights or settings (the directory changed since)")
    return (f"--corpus {args.corpus} was embedded by --model {args.model} with {what}; the query would not be "
            "embedded as the corpus was. Re-embed the corpus, or pass --allow-other-model")


def run(args: argparse.Namespace) -> int:
    from bertjax.commands.embed import load_embedder
    from bertjax.embeddings.corpus import described_texts, model_fingerprint, read_description, read_texts
    from bertjax.embeddings.search import SEARCH_SIMILARITIES, top_k_search

    if args.k <= 0:
        raise ValueError(f"-k must be positive, got {args.k}")
    corpus = load_corpus(args.corpus)
    description = read_description(args.corpus, corpus.shape) or {}
    # Before the model loads: FILE.json's input must be the file that was embedded (else an error asks for --texts).
    source = args.texts or described_texts(args.corpus, description)
    # The query embedded as the corpus was: its Matryoshka truncation and its normalisation (both part of the
    # fingerprint, so a corpus embedded with --normalize is the same model's).
    if args.truncate_dim is None and description.get("truncate_dim"):
        args.truncate_dim = description["truncate_dim"]
    if not args.normalize and description.get("normalized"):
        args.normalize = True
    embedder = load_embedder(args)
    encoder = embedder.encoder
    if embedder.dim != corpus.shape[1]:
        raise ValueError(f"dimension mismatch: --model {args.model} gives {embedder.dim}-dimensional embeddings, the "
                         f"corpus {args.corpus} holds {corpus.shape[1]}-dimensional ones (embedded by "
                         f"{description.get('model', 'another model')}); embed the corpus with this model")
    recorded = description.get("model_fingerprint")
    if recorded and recorded != model_fingerprint(encoder) and not args.allow_other_model:
        raise ValueError(fingerprint_mismatch(args, description, encoder))
    prompt_name = args.prompt_name
    if prompt_name is None and args.prompt is None and "query" in encoder.prompts:
        prompt_name = "query"
    queries = embedder.embed(args.query, prompt_name=prompt_name, prompt=args.prompt)
    # As the corpus was meant to be compared: a model trained with dot-product scores ranks by them.
    similarity = args.similarity or description.get("similarity_fn_name") or encoder.similarity_fn_name
    if similarity not in SEARCH_SIMILARITIES:
        print(f"warning: --model {args.model} compares embeddings by {similarity}, which search does not rank by; "
              "ranking by cosine (--similarity chooses)", file=sys.stderr)
        similarity = "cosine"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        scores, indices = top_k_search(queries, corpus, args.k, similarity=similarity, chunk_size=args.chunk_size)
    for warning in caught:  # NaN rows, never returned: one plain line rather than a Python warning
        print(f"warning: --corpus {args.corpus}: {warning.message}", file=sys.stderr)

    texts = None
    if source and Path(source).is_file():
        column = args.column or description.get("column") or "text"
        texts, _ = read_texts(source, column, errors="replace")
        if len(texts) != corpus.shape[0]:
            raise ValueError(f"{source} holds {len(texts)} texts but the corpus {corpus.shape[0]} embeddings; "
                             "give the file that was embedded with --texts")
    for query, row_scores, row_indices in zip(args.query, scores, indices):
        hits = [{"rank": r + 1, "index": int(i), "score": float(s), **({"text": texts[i]} if texts else {})}
                for r, (s, i) in enumerate(zip(row_scores, row_indices))]
        if args.json:
            print(json.dumps({"query": query, "hits": hits}, ensure_ascii=False))
            continue
        print(f"query: {query}")
        for hit in hits:
            shown = hit.get("text", "")
            shown = shown if len(shown) <= 100 else shown[:97] + "..."
            print(f"  {hit['rank']:>3}  {hit['score']:.4f}  #{hit['index']}  {shown}")
    return 0
