"""Throughput of the pretraining data pipeline in one process, from raw text and from prepared ArrayRecord.

    python -m bench.data_bench [--seconds 4] [--batch 64] [--seqs 128 512] [--threads 0 1 2]

Setup (timed and reported too): train the default SentencePiece tokenizer (BPE, 8192) on the embedded default
corpus and `prepare` the corpus into ArrayRecord in a temporary directory. Then, per input (raw / prepared),
sequence length and number of window-building threads, the iterator is warmed up by one batch and timed over
`--seconds`; reported are row slots per second (batch x seq_len: what the trainer consumes), real tokens per
second (non-padding slots) and the packing efficiency of the windows built. A few objective variants (whole-word
and span masking, NSP pairs) are timed on prepared data at seq 128. Target: >= 500k tokens/s from prepared data.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time

from bertjax.data.default_corpus import default_corpus_documents
from bertjax.data.pipeline import DataConfig, build_pretraining_iterator
from bertjax.data.prepare import prepare_corpus
from bertjax.data.tokenizer_training import train_default_tokenizer


def measure(config: DataConfig, tokenizer, seconds: float) -> dict:
    iterator = build_pretraining_iterator(config, tokenizer, seed=0)
    next(iterator)  # warm-up: starts threads and the first windows
    slots = real = batches = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = next(iterator)
        slots += batch["input_ids"].size
        real += int((batch["segment_ids"] > 0).sum())
        batches += 1
    elapsed = time.perf_counter() - start
    iterator.close()
    return {"slots_per_s": slots / elapsed, "real_per_s": real / elapsed, "batches": batches,
            "efficiency": iterator.stats.packing_efficiency}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="timing length per configuration")
    parser.add_argument("--batch", type=int, default=64, help="rows per batch (one process)")
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    print(f"# data pipeline benchmark: {datetime.date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
    start = time.perf_counter()
    documents = default_corpus_documents("all")
    print(f"default corpus: {len(documents)} documents, {sum(map(len, documents)) / 1e6:.2f} MB characters "
          f"({time.perf_counter() - start:.1f} s, cached after the first build)")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        tokenizer = train_default_tokenizer(os.path.join(tmp, "tokenizer"))
        print(f"train_default_tokenizer (bpe, {tokenizer.vocab_size}): {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        metadata = prepare_corpus("default", tokenizer, os.path.join(tmp, "prepared"))
        elapsed = time.perf_counter() - start
        tokens = sum(split["tokens"] for split in metadata["splits"].values())
        print(f"prepare: {tokens} tokens in {elapsed:.1f} s ({tokens / elapsed / 1e3:.0f}k tokens/s)")

        inputs = {"raw text": "default", "prepared": os.path.join(tmp, "prepared")}
        print("\n| input | seq | threads | row slots/s | real tokens/s | packing efficiency |")
        print("|---|---|---|---|---|---|")
        for name, path in inputs.items():
            for seq in args.seqs:
                for threads in args.threads:
                    config = DataConfig(input=path, seq_len=seq, global_batch_size=args.batch,
                                        worker_threads=threads, prefetch_windows=max(2, threads))
                    r = measure(config, tokenizer, args.seconds)
                    print(f"| {name} | {seq} | {threads} | {r['slots_per_s'] / 1e3:,.0f}k | "
                          f"{r['real_per_s'] / 1e3:,.0f}k | {r['efficiency']:.4f} |", flush=True)

        print("\n| objective (prepared, seq 128, 1 thread) | row slots/s |")
        print("|---|---|")
        variants = {"token masking 15%": {}, "token masking 30%": {"mlm_probability": 0.3},
                    "whole-word masking": {"masking": "whole_word"}, "span masking": {"masking": "span"},
                    "NSP pairs (padded rows)": {"packing": "pad", "sentence_objective": "nsp"}}
        for label, changes in variants.items():
            config = DataConfig(input=inputs["prepared"], seq_len=128, global_batch_size=args.batch,
                                worker_threads=1, **changes)
            r = measure(config, tokenizer, args.seconds)
            print(f"| {label} | {r['slots_per_s'] / 1e3:,.0f}k |", flush=True)


if __name__ == "__main__":
    main()
