"""Embedding throughput on CPU: bertjax `Embedder` (what `bertjax embed` runs) vs sentence-transformers `encode` vs
padded transformers, on fixed-length and variable-length texts (the ModernBERT paper's Table 2 setting, scaled to
a CPU), same random-weight models, same texts, same run.

    python -m bench.embed_bench [--models bert-base modernbert-base] [--texts 2000] [--max-length 128] [--cpu-time]
    python -m bench.embed_bench --cpu-time --texts 256 --sweep-max-tokens 1024 2048 4096 16384   # batch size on CPU

Texts: `--texts` texts of single-token words (a WordPiece vocabulary of whole words, so a text of n words is n + 2
tokens with [CLS] and [SEP]). Fixed: every text `--max-length` tokens. Variable: token counts drawn from a normal
distribution around half the maximum (standard deviation a quarter of the mean, clipped to [3, max]), as the paper's
variable set centres 512-token models at 256 (std 64). tokens/s counts real tokens only (no padding), over the
whole corpus, after a warm-up (bertjax: `Embedder.warm_up`, which compiles every program a job may need, then 32
texts; torch: 32 texts), per wall second and per CPU second of the process (all its threads).

`--cpu-time`: XLA and torch each on one thread (XLA's flag is set before jax is imported: XLA reads its flags at
import), so CPU seconds measure the work itself, which other jobs on a shared machine disturb far less than wall time.

Systems (one process, one model's weights for all three; float32 on CPU):
  bertjax      Embedder: packed rows, shape buckets, --max-tokens per batch (default: bertjax embed's, by platform)
  st           sentence-transformers SentenceTransformer.encode(batch_size=32): sorts texts by length, pads per batch
  transformers AutoModel + mean pooling, batches of 32 in input order, each padded to its longest text
The embeddings of bertjax and sentence-transformers are compared too (max abs difference), and bertjax's time is
broken down (tokenising, packing fill, batch shapes, programs compiled while timed).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time

if "--cpu-time" in sys.argv:  # XLA reads its flags when jax is imported: one thread for every XLA computation
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"

import numpy as np

from bertjax.cpu_allocator import reuse_freed_memory  # noqa: E402

reuse_freed_memory()  # as `bertjax embed` does on CPU, for every system in this process


def make_texts(count: int, max_length: int, variable: bool, vocab: list[str], seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    body = max_length - 2  # [CLS] and [SEP]
    if variable:
        mean = max_length / 2
        lengths = np.clip(np.rint(rng.normal(mean, mean / 4, count)), 3, max_length).astype(int) - 2
    else:
        lengths = np.full(count, body)
    return [" ".join(rng.choice(vocab, n)) for n in lengths]


def real_tokens(texts: list[str], max_length: int) -> int:
    return sum(min(len(t.split()) + 2, max_length) for t in texts)


def timed(fn, warm_up) -> tuple[float, float]:
    """(wall seconds, process CPU seconds: every thread of this process, so the rate per CPU-second is what a
    machine shared with other jobs can still measure fairly)."""
    warm_up()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def build_models(name: str, directory: str, vocab: list[str], max_length: int):
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *vocab]
    tokenizer = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=False)
    if name.startswith("modernbert"):
        config = transformers.ModernBertConfig(vocab_size=len(tokens), pad_token_id=0, cls_token_id=2, sep_token_id=3,
                                               bos_token_id=2, eos_token_id=3)
    else:
        config = transformers.BertConfig(vocab_size=len(tokens))
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="sdpa").eval()
    hf_dir = os.path.join(directory, "hf")
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    transformer = Transformer(hf_dir, max_seq_length=max_length)
    st = SentenceTransformer(modules=[transformer, Pooling(config.hidden_size, pooling_mode="mean")], device="cpu")
    st.eval()
    st_dir = os.path.join(directory, "st")
    st.save(st_dir)
    return st, st_dir, model, tokenizer


def padded_transformers(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 32) -> np.ndarray:
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(((hidden * mask).sum(1) / mask.sum(1)).numpy())
    return np.concatenate(out)


def bertjax_breakdown(embedder, texts: list[str]) -> str:
    """Where bertjax's time goes on `texts`, apart from the model: tokenising (CPU seconds), how full the packed
    batches are (real tokens / computed tokens) and which batch shapes run."""
    from bertjax.inference.packing import pack
    from bertjax.inference.pipeline import to_sequences

    start = time.process_time()
    token_ids = embedder.token_ids(texts)
    tokenize = time.process_time() - start
    inference = embedder._inference(None)
    sequences = to_sequences(token_ids, inference.format, inference.overflow, inference.stride).ids
    start = time.process_time()
    batches, _ = pack(sequences, inference.plan, inference.pad_id, packing=inference.packing,
                      devices=inference.runner.devices)
    packing = time.process_time() - start
    computed = sum(b.input_ids.size for b in batches)
    real = sum(len(s) for s in sequences)
    shapes: dict[tuple[int, int], int] = {}
    for b in batches:
        shapes[b.input_ids.shape] = shapes.get(b.input_ids.shape, 0) + 1
    listed = ", ".join(f"{n}x[{r},{length}]" for (r, length), n in sorted(shapes.items(), key=lambda x: x[0][::-1]))
    return (f"tokenise {tokenize:.2f} CPU-s, pack {packing:.2f} CPU-s, fill {real / computed:.1%} "
            f"({real:,} of {computed:,} tokens), batches {listed}")


def sweep_max_tokens(args, vocab: list[str]) -> None:
    """bertjax's fixed-length tokens per (CPU) second at each token budget: what the platform default rests on."""
    from bertjax.embeddings import Embedder, load_sentence_encoder

    print("| model | max_tokens | rows x length | tokens/s | tokens/CPU-s |")
    print("|---|---:|---|---:|---:|")
    texts = make_texts(args.texts, args.max_length, False, vocab, seed=1)
    tokens = real_tokens(texts, args.max_length)
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            _, st_dir, _, _ = build_models(name, tmp, vocab, args.max_length)
            encoder = load_sentence_encoder(st_dir)
            for max_tokens in args.sweep_max_tokens:
                embedder = Embedder(encoder, max_tokens=max_tokens, dtype="float32")
                embedder.warm_up()
                inference = embedder._inference(None)
                rows = inference.plan.rows[inference.plan.max_length]
                seconds, cpu = timed(lambda: embedder.embed(texts), lambda: embedder.embed(texts[:32]))
                print(f"| {name} | {max_tokens} | {rows} x {args.max_length} | {tokens / seconds:,.0f} | "
                      f"{tokens / cpu:,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert-base", "modernbert-base"])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="bertjax's token budget per batch (default: bertjax embed's for the platform)")
    parser.add_argument("--systems", nargs="+", default=["bertjax", "st", "transformers"])
    parser.add_argument("--cpu-time", action="store_true",
                        help="XLA and torch on one thread each; rates per CPU second (a shared machine)")
    parser.add_argument("--sweep-max-tokens", type=int, nargs="+", metavar="N",
                        help="instead of the table: bertjax's fixed-length rate at each token budget per batch")
    args = parser.parse_args()

    from bertjax.platforms import quiet_start

    quiet_start()  # no libtpu probing on a CPU machine
    import jax
    import torch

    from bertjax.embeddings import Embedder, load_sentence_encoder

    if args.cpu_time:
        torch.set_num_threads(1)
    vocab = [f"w{i}" for i in range(4000)]
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(open('/proc/loadavg').read().split()[:3]) if os.path.exists('/proc/loadavg') else '?'}, "
          f"jax {jax.__version__} ({jax.default_backend()}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '').strip()!r}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads); {args.texts} texts, max length "
          f"{args.max_length}, max_tokens {args.max_tokens or 'default'}", flush=True)
    if args.sweep_max_tokens:
        return sweep_max_tokens(args, vocab)
    print("| model | system | fixed tokens/s | variable tokens/s | fixed tokens/CPU-s | variable tokens/CPU-s | "
          "variable / fixed (CPU) | variable vs st (CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            st, st_dir, hf_model, tokenizer = build_models(name, tmp, vocab, args.max_length)
            embedder = Embedder(load_sentence_encoder(st_dir), max_tokens=args.max_tokens, dtype="float32")
            warm_compiles = embedder.warm_up() if "bertjax" in args.systems else 0
            runners = {
                "bertjax": lambda texts: embedder.embed(texts),
                "st": lambda texts: st.encode(texts, batch_size=32, convert_to_numpy=True),
                "transformers": lambda texts: padded_transformers(hf_model, tokenizer, texts, args.max_length),
            }
            rates: dict[str, dict[str, float]] = {}
            cpu_rates: dict[str, dict[str, float]] = {}
            outputs = {}
            notes = []
            for setting in ("fixed", "variable"):
                texts = make_texts(args.texts, args.max_length, setting == "variable", vocab, seed=1)
                tokens = real_tokens(texts, args.max_length)
                for system in args.systems:
                    result = {}

                    def run(system=system, texts=texts, result=result):
                        result["out"] = runners[system](texts)

                    # bertjax compiled every program it may need in warm_up; 32 texts warm the rest of its path,
                    # and torch's allocator and thread pool.
                    compiles = embedder.compiles
                    seconds, cpu = timed(run, lambda system=system: runners[system](texts[:32]))
                    rates.setdefault(system, {})[setting] = tokens / seconds
                    cpu_rates.setdefault(system, {})[setting] = tokens / cpu
                    outputs[(system, setting)] = result["out"]
                    if system == "bertjax":
                        notes.append(f"#   {name} {setting}: {tokens:,} tokens, {cpu:.1f} CPU-s; "
                                     f"{bertjax_breakdown(embedder, texts)}; "
                                     f"programs compiled while timed: {embedder.compiles - compiles}")
            for system in args.systems:
                fixed, variable = rates[system]["fixed"], rates[system]["variable"]
                cpu_fixed, cpu_variable = cpu_rates[system]["fixed"], cpu_rates[system]["variable"]
                versus = f"{cpu_variable / cpu_rates['st']['variable']:.2f}x" if "st" in cpu_rates else "-"
                print(f"| {name} | {system} | {fixed:,.0f} | {variable:,.0f} | {cpu_fixed:,.0f} | {cpu_variable:,.0f} "
                      f"| {cpu_variable / cpu_fixed:.2f} | {versus} |", flush=True)
            for note in notes:
                print(note, flush=True)
            if "bertjax" in args.systems and "st" in args.systems:
                error = max(np.abs(outputs[("bertjax", s)] - outputs[("st", s)]).max() for s in ("fixed", "variable"))
                print(f"#   {name}: bertjax vs sentence-transformers embeddings, max abs difference {error:.1e}; "
                      f"bertjax compiled {embedder.compiles} programs ({warm_compiles} in warm_up)", flush=True)

if __name__ == "__main__":
    main()
