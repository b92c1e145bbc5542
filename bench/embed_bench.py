"""Embedding throughput on CPU: bertjax `Embedder` (what `bertjax embed` runs) vs sentence-transformers `encode` vs
padded transformers, on fixed-length and variable-length texts (the ModernBERT paper's Table 2 setting, scaled to
a CPU), same random-weight models, same texts, same run; and with `--gpu`, the paper's Table 2 setting itself.

    python -m bench.embed_bench [--models bert-base modernbert-base] [--texts 2000] [--max-length 128] [--cpu-time]
    python -m bench.embed_bench --cpu-time --texts 256 --sweep-max-tokens 1024 2048 4096 16384   # batch size on CPU
    python -m bench.embed_bench --gpu [--json FILE]                            # GPU: the paper's Table 2 setting
    python -m bench.embed_bench --gpu --models modernbert-base --sweep-max-tokens 16384 65536 262144   # GPU budget
    python -m bench.embed_bench --gpu --dry-run --texts 16 --long-texts 4 --lengths 64 640   # --gpu's code on CPU

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

`--gpu` (accelerator_table): the ModernBERT paper's Table 2 inference setting. Short context (`--lengths` <= 512):
bert-base and modernbert-base, `--texts` texts (default the paper's 8,192), fixed 512 tokens and variable lengths
normal around 256 (std 64); long context: modernbert-base alone (bert-base has 512 positions), fixed 8,192 and
variable around 4,096 (std 1,024), `--long-texts` texts (default 512: the paper's 8,192 texts of 8,192 tokens are
67M tokens a setting, minutes per system even on an H100). Every system computes in bfloat16, as `bertjax embed`
does on accelerators: bertjax with float32 parameters and bf16 compute, attention "auto" (`pallas_gpu`);
transformers' AutoModel with sdpa attention, weights cast to bfloat16 (`model.to(torch.bfloat16)`, the usual
bf16 inference, no autocast), texts in input order, each batch padded to its longest, as many texts per batch as
bertjax's full-length batch has rows (`--hf-batch`); st (only when named in `--systems`) the same batch size,
bf16 weights, its own tokenising inside the time. Texts are tokenised once per system before the clock starts
(reported apart, as the paper times the model): bertjax through `Embedder.token_ids` then `embed_token_ids`,
transformers through its tokenizer. Warm-up: bertjax compiles the programs its job needs (`warm_up(token_ids=)`,
reported with its seconds), then 32 texts; transformers runs its first batch. Wall clock with the device drained
(bertjax reads every result back to the host; torch.cuda.synchronize), median of `--repeats` passes. Printed: a
line per measurement, then a markdown table (tokens/s, variable / fixed, bertjax / transformers, the paper's RTX
4090 figures) and the budget and memory notes; `--json FILE` keeps every number. `--dry-run` runs this path on
CPU (use tiny `--texts`, `--long-texts` and `--lengths`) to check the script before spending device time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

# Process settings, made before jax is imported, only when run as a program (tests import the functions).
ON_GPU = __name__ == "__main__" and "--gpu" in sys.argv and "--dry-run" not in sys.argv
if __name__ == "__main__" and "--cpu-time" in sys.argv:  # XLA reads its flags when jax is imported: one thread
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
if ON_GPU:  # JAX takes 75% of the GPU's memory when it starts; torch runs in this process too
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import numpy as np

from bertjax.cpu_allocator import reuse_freed_memory  # noqa: E402

if __name__ == "__main__" and not ON_GPU:
    reuse_freed_memory()  # as `bertjax embed` does on CPU (only there), for every system in this process

SETTINGS = ("fixed", "variable")
# The ModernBERT paper's Table 2 (RTX 4090, thousands of tokens per second, real tokens): (model, length, setting)
# -> tokens/s. Only the figures this bench is held to; the table has more.
PAPER_RTX4090 = {("modernbert-base", 512, "fixed"): 148_000, ("modernbert-base", 8192, "fixed"): 124_000}
SHORT_CONTEXT = 512  # lengths up to this take --texts texts; longer ones --long-texts


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


def hf_config(name: str, vocab_size: int):
    """transformers' config of `name` at the preset's size (random weights: none can be downloaded here)."""
    import transformers

    if name.startswith("modernbert"):
        return transformers.ModernBertConfig(vocab_size=vocab_size, pad_token_id=0, cls_token_id=2, sep_token_id=3,
                                             bos_token_id=2, eos_token_id=3)
    return transformers.BertConfig(vocab_size=vocab_size)


def build_models(name: str, directory: str, vocab: list[str], max_length: int):
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *vocab]
    tokenizer = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=False)
    config = hf_config(name, len(tokens))
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


def hf_token_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """transformers' token ids per text, [CLS] and [SEP] included, truncated to `max_length`."""
    return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]


def padded_forward(model, token_ids: list[list[int]], batch_size: int, pad_id: int, device: str = "cpu") -> np.ndarray:
    """transformers' embeddings of tokenised texts: batches of `batch_size` in input order, each padded to its
    longest text, mean pooling over real tokens in float32. float32 numpy [texts, hidden]; on a GPU the final copy
    to the host waits for every batch."""
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(token_ids), batch_size):
            chunk = token_ids[start:start + batch_size]
            ids = np.full((len(chunk), max(map(len, chunk))), pad_id, np.int64)
            mask = np.zeros(ids.shape, np.int64)
            for row, sequence in enumerate(chunk):
                ids[row, :len(sequence)], mask[row, :len(sequence)] = sequence, 1
            ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
            if device == "cuda":  # pinned: the copy is queued behind the running batch instead of waiting for it
                ids, mask = ids.pin_memory(), mask.pin_memory()
            ids, mask = ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            weights = mask.unsqueeze(-1).float()
            out.append((hidden * weights).sum(1) / weights.sum(1))
    return torch.cat(out).cpu().numpy()


def padded_transformers(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 32) -> np.ndarray:
    """The CPU table's transformers system: tokenising inside the time, then padded_forward."""
    return padded_forward(model, hf_token_ids(tokenizer, texts, max_length), batch_size, tokenizer.pad_token_id)


def packing_summary(embedder, token_ids: list[np.ndarray]) -> tuple[float, str]:
    """(CPU seconds of packing, "fill ... batches ...": how full bertjax's packed batches are (real tokens /
    computed tokens) and which batch shapes run) for texts tokenised by `embedder.token_ids`."""
    from bertjax.inference.packing import pack
    from bertjax.inference.pipeline import to_sequences

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
    return packing, f"fill {real / computed:.1%} ({real:,} of {computed:,} tokens), batches {listed}"


def bertjax_breakdown(embedder, texts: list[str]) -> str:
    """Where bertjax's time goes on `texts`, apart from the model: tokenising (CPU seconds), how full the packed
    batches are (real tokens / computed tokens) and which batch shapes run."""
    start = time.process_time()
    token_ids = embedder.token_ids(texts)
    tokenize = time.process_time() - start
    packing, summary = packing_summary(embedder, token_ids)
    return f"tokenise {tokenize:.2f} CPU-s, pack {packing:.2f} CPU-s, {summary}"


def texts_for(args, length: int) -> int:
    """Texts per setting at `length`: --texts on CPU and for short context, --long-texts beyond 512 on --gpu."""
    return args.texts if not args.gpu or length <= SHORT_CONTEXT else args.long_texts


def models_for(names: list[str], length: int) -> list[str]:
    """The models whose position table takes rows of `length` tokens (bert-base: 512; modernbert-base: 8,192)."""
    return [name for name in names if hf_config(name, 8).max_position_embeddings >= length]


def load_bertjax(st_dir: str, attention: str):
    """bertjax's encoder of the sentence-transformers directory, attention implementation `attention`."""
    from bertjax.embeddings import load_sentence_encoder

    encoder = load_sentence_encoder(st_dir)
    if attention != encoder.config.attention_implementation:
        encoder = encoder.replace(model=encoder.model.clone(config=encoder.config.replace(
            attention_implementation=attention)))
    return encoder


def device_peak_gb() -> float | None:
    """Peak bytes JAX has held on its first device so far (None where the backend keeps no statistics: CPU)."""
    import jax

    stats = jax.local_devices()[0].memory_stats()
    return stats["peak_bytes_in_use"] / 2**30 if stats and "peak_bytes_in_use" in stats else None


def sweep_max_tokens(args, vocab: list[str], lengths: list[int], dtype: str) -> None:
    """bertjax's fixed-length tokens per (CPU) second at each token budget: what the platform default rests on.
    Texts are tokenised once, outside the time; warm_up compiles the programs of the job."""
    from bertjax.embeddings import Embedder

    print("| model | max_tokens | rows x length | tokens/s | tokens/CPU-s |")
    print("|---|---:|---|---:|---:|")
    for length in lengths:
        texts = make_texts(texts_for(args, length), length, False, vocab, seed=1)
        tokens = real_tokens(texts, length)
        for name in models_for(args.models, length):
            with tempfile.TemporaryDirectory() as tmp:
                _, st_dir, _, _ = build_models(name, tmp, vocab, length)
                encoder = load_bertjax(st_dir, args.attention)
                ids = Embedder(encoder, dtype=dtype).token_ids(texts)  # the budget changes batches, not tokens
                for max_tokens in args.sweep_max_tokens:
                    embedder = Embedder(encoder, max_tokens=max_tokens, dtype=dtype)
                    embedder.warm_up(token_ids=ids)
                    inference = embedder._inference(None)
                    rows = inference.plan.rows[inference.plan.max_length]
                    seconds, cpu = timed(lambda: embedder.embed_token_ids(ids),
                                         lambda: embedder.embed_token_ids(ids[:32]))
                    peak = device_peak_gb()
                    print(f"| {name} | {max_tokens} | {rows} x {length} | {tokens / seconds:,.0f} | "
                          f"{tokens / cpu:,.0f} |" + (f" peak device memory so far {peak:.1f} GiB" if peak else ""),
                          flush=True)


# ---------------------------------------------------------------------------------------------------------------
# --gpu: the paper's Table 2 setting on an accelerator (or, with --dry-run, the same code on CPU).

def wall_time(fn, repeats: int, synchronize) -> tuple[float, list[float], object]:
    """(median seconds, every pass's seconds, the last output) of `fn` over `repeats` passes, each from a drained
    device to a drained device."""
    passes, out = [], None
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        out = fn()
        synchronize()
        passes.append(time.perf_counter() - start)
    return statistics.median(passes), passes, out


def max_relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max over texts of |a_i - b_i| / |b_i| for two systems' embeddings of the same texts, each less its mean over
    the texts: a random-weight model gives every text nearly the same embedding, and only the rest (what tells
    texts apart, where attention shows) would reveal a wrong computation."""
    a, b = a - a.mean(0), b - b.mean(0)
    return float((np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1), 1e-12)).max())


REPORTED_ERRORS: set[str] = set()


def bench_model(name: str, length: int, corpora: dict[str, list[str]], vocab: list[str], args, device: str,
                record) -> None:
    """Every system of args.systems on both settings of one model at one length; `record(row)` gets each result."""
    import torch

    from bertjax.embeddings import Embedder

    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:  # every system holds its weights in memory once loaded
        st, st_dir, hf_model, tokenizer = build_models(name, tmp, vocab, length)
        embedder = Embedder(load_bertjax(st_dir, args.attention), max_tokens=args.max_tokens, dtype="bfloat16")
    plan = embedder._inference(None).plan
    rows = plan.rows[plan.max_length]  # rows of a full-length batch: the budget's largest batch
    hf_batch = args.hf_batch or rows
    hf_model = hf_model.to(device=device, dtype=torch.bfloat16)
    st = st.to(device=device, dtype=torch.bfloat16) if "st" in args.systems else None
    outputs: dict[tuple[str, str], np.ndarray] = {}
    recorded: dict[tuple[str, str], dict] = {}
    for setting in SETTINGS:
        texts = corpora[setting]
        for system in args.systems:
            row = {"length": length, "model": name, "system": system, "setting": setting, "texts": len(texts),
                   "device": device}
            try:
                if system == "bertjax":
                    start = time.perf_counter()
                    ids = embedder.token_ids(texts)
                    row["tokenise_s"] = time.perf_counter() - start
                    row["tokens"] = sum(min(len(i) + 2, length) for i in ids)
                    start = time.perf_counter()
                    row["warm_up_compiles"] = embedder.warm_up(token_ids=ids)
                    row["warm_up_s"] = time.perf_counter() - start
                    embedder.embed_token_ids(ids[:32])
                    compiles = embedder.compiles
                    # Results come back to the host batch by batch (numpy): the device is drained when it returns.
                    seconds, passes, out = wall_time(lambda: embedder.embed_token_ids(ids), args.repeats,
                                                     synchronize)
                    row["compiled_while_timed"] = embedder.compiles - compiles
                    row["max_tokens"], row["rows_per_batch"] = rows * plan.max_length, rows
                    row["packing"] = packing_summary(embedder, ids)[1]
                    row["peak_device_gib"] = device_peak_gb()
                elif system == "transformers":
                    start = time.perf_counter()
                    ids = hf_token_ids(tokenizer, texts, length)
                    row["tokenise_s"] = time.perf_counter() - start
                    row["tokens"] = sum(map(len, ids))
                    row["batch"] = hf_batch
                    padded_forward(hf_model, ids[:hf_batch], hf_batch, tokenizer.pad_token_id, device)
                    seconds, passes, out = wall_time(
                        lambda: padded_forward(hf_model, ids, hf_batch, tokenizer.pad_token_id, device),
                        args.repeats, synchronize)
                    row["peak_torch_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
                else:  # st: tokenises inside its encode, so inside the time
                    row["tokens"] = real_tokens(texts, length)
                    row["batch"] = hf_batch
                    st.encode(texts[:hf_batch], batch_size=hf_batch)
                    seconds, passes, out = wall_time(
                        lambda: st.encode(texts, batch_size=hf_batch, convert_to_numpy=True), args.repeats,
                        synchronize)
                    out = np.asarray(out, np.float32)
                row["seconds"], row["passes_s"] = seconds, passes
                row["tokens_per_s"] = row["tokens"] / seconds
                outputs[(system, setting)] = out
            except Exception as error:  # one failing system must not cost the rest of the device run
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
                if row["error"] not in REPORTED_ERRORS:  # the whole traceback once: the output's tail is short
                    REPORTED_ERRORS.add(row["error"])
                    traceback.print_exc()
            recorded[(system, setting)] = row
            record(row)
    for (system, setting), row in recorded.items():  # systems timed before transformers: compare now
        theirs = outputs.get(("transformers", setting))
        if system != "transformers" and (system, setting) in outputs and theirs is not None:
            row["difference_vs_transformers"] = max_relative_difference(outputs[(system, setting)], theirs)
            print(f"#   {name} {length} {setting}: {system} vs transformers embeddings, max relative difference "
                  f"{row['difference_vs_transformers']:.1e}", flush=True)
    del hf_model, st, embedder
    if device == "cuda":
        torch.cuda.empty_cache()


STARTED = time.perf_counter()


def progress_line(row: dict) -> str:
    if "error" in row:
        return (f"# [{row['elapsed_s']:.0f}s] {row['model']} {row['length']} {row['setting']} {row['system']}: "
                f"ERROR {row['error']}")
    extra = ""
    if row["system"] == "bertjax":
        extra = (f", tokenise {row['tokenise_s']:.1f}s, warm-up {row['warm_up_compiles']} programs in "
                 f"{row['warm_up_s']:.1f}s, {row['compiled_while_timed']} compiled while timed, budget "
                 f"{row['rows_per_batch']} x {row['length']}, {row['packing']}")
    elif row["system"] == "transformers":
        extra = f", tokenise {row['tokenise_s']:.1f}s, batches of {row['batch']} texts"
    passes = "/".join(f"{p:.2f}" for p in row["passes_s"])
    return (f"# [{row['elapsed_s']:.0f}s] {row['model']} {row['length']} {row['setting']} {row['system']}: "
            f"{row['tokens']:,} tokens in {passes}s -> {row['tokens_per_s']:,.0f} tokens/s{extra}")


def accelerator_table(rows: list[dict]) -> str:
    """The markdown table of the Table 2 run: one line per (length, model, system); ratios to transformers."""
    lines = ["| length | model | system | texts | fixed tokens/s | variable tokens/s | variable / fixed | "
             "fixed vs transformers | variable vs transformers | paper RTX 4090 fixed |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    rate = {(r["length"], r["model"], r["system"], r["setting"]): r.get("tokens_per_s") for r in rows}
    seen = []
    for r in rows:
        key = (r["length"], r["model"], r["system"])
        if key in seen:
            continue
        seen.append(key)
        fixed, variable = rate.get(key + ("fixed",)), rate.get(key + ("variable",))
        base = {s: rate.get((r["length"], r["model"], "transformers", s)) for s in SETTINGS}

        def show(value, form):  # "-": not measured, or failed (the notes under the table say why)
            return form.format(value) if value else "-"

        ratio = show(variable / fixed if fixed and variable else None, "{:.2f}")
        versus = [show(ours / theirs if ours and theirs else None, "{:.2f}x")
                  for ours, theirs in ((fixed, base["fixed"]), (variable, base["variable"]))]
        paper = PAPER_RTX4090.get((r["model"], r["length"], "fixed"))
        lines.append(f"| {r['length']} | {r['model']} | {r['system']} | {r['texts']:,} | {show(fixed, '{:,.0f}')} | "
                     f"{show(variable, '{:,.0f}')} | {ratio} | {versus[0]} | {versus[1]} | "
                     f"{f'{paper:,}' if paper else '-'} |")
    return "\n".join(lines)


def run_accelerator(args, vocab: list[str], device: str, header: str) -> None:
    """The Table 2 run: both settings at every length of args.lengths, every model that takes it."""
    rows: list[dict] = []

    def save() -> None:
        if args.json:  # rewritten after every measurement: a run stopped at its time limit keeps what it did
            with open(args.json, "w") as f:
                json.dump({"header": header, "args": vars(args), "rows": rows}, f, indent=1)

    def record(row: dict) -> None:
        row["elapsed_s"] = time.perf_counter() - STARTED  # where a run's 10 minutes go (model building, compiles)
        rows.append(row)
        print(progress_line(row), flush=True)
        save()

    corpora_by_length: dict[int, dict[str, list[str]]] = {}

    def corpora(length: int) -> dict[str, list[str]]:
        if length not in corpora_by_length:
            count, start = texts_for(args, length), time.perf_counter()
            corpora_by_length[length] = {setting: make_texts(count, length, setting == "variable", vocab, seed=1)
                                         for setting in SETTINGS}
            print(f"# {length}: {count:,} texts per setting generated in {time.perf_counter() - start:.1f}s",
                  flush=True)
        return corpora_by_length[length]

    try:
        # Model by model, in the order given, each at every length it takes: a run stopped at its time cap has the
        # first model's whole row of the table.
        for name in args.models:
            for length in args.lengths:
                if name in models_for([name], length):
                    bench_model(name, length, corpora(length), vocab, args, device, record)
                    save()  # with the embedding comparisons added after the model's last measurement
    except KeyboardInterrupt:  # launch/gpu_session.sh's time cap
        print("# interrupted: the table below is of the rows above", flush=True)
    print(f"\n{header}")
    print(accelerator_table(rows))
    for r in rows:
        if r["system"] == "bertjax" and "error" not in r:
            peak = f", peak JAX device memory {r['peak_device_gib']:.1f} GiB" if r["peak_device_gib"] else ""
            if "difference_vs_transformers" in r:
                peak += f"; vs transformers' embeddings {r['difference_vs_transformers']:.1e} (max relative)"
            print(f"#   {r['model']} {r['length']} {r['setting']}: bertjax budget {r['max_tokens']:,} tokens "
                  f"({r['rows_per_batch']} x {r['length']}), {r['packing']}; warm-up {r['warm_up_compiles']} programs "
                  f"{r['warm_up_s']:.0f}s, {r['compiled_while_timed']} compiled while timed; tokenise "
                  f"{r['tokenise_s']:.1f}s{peak}")
        elif r["system"] == "transformers" and "error" not in r:
            peak = f", peak torch memory {r['peak_torch_gib']:.1f} GiB" if r.get("peak_torch_gib") else ""
            print(f"#   {r['model']} {r['length']} {r['setting']}: transformers batches of {r['batch']} texts, "
                  f"tokenise {r['tokenise_s']:.1f}s{peak}")
        elif "error" in r:
            print(f"#   {r['model']} {r['length']} {r['setting']} {r['system']}: {r['error']}")
    print(f"# whole run {time.perf_counter() - STARTED:.0f}s")


def cpu_table(args, vocab: list[str]) -> None:
    """The CPU table: every system of args.systems, both settings, each model at --max-length (float32)."""
    from bertjax.embeddings import Embedder, load_sentence_encoder

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


def parse_args(argv=None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert-base", "modernbert-base"])
    parser.add_argument("--texts", type=int, default=None,
                        help="texts per setting (default 2000 on CPU; with --gpu the paper's 8192, short context)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="bertjax's token budget per batch (default: bertjax embed's for the platform)")
    parser.add_argument("--systems", nargs="+", choices=("bertjax", "st", "transformers"), default=None,
                        help="default: bertjax st transformers on CPU, bertjax transformers with --gpu")
    parser.add_argument("--cpu-time", action="store_true",
                        help="XLA and torch on one thread each; rates per CPU second (a shared machine)")
    parser.add_argument("--sweep-max-tokens", type=int, nargs="+", metavar="N",
                        help="instead of the table: bertjax's fixed-length rate at each token budget per batch")
    gpu = parser.add_argument_group("--gpu: the ModernBERT paper's Table 2 setting on a GPU, bfloat16")
    gpu.add_argument("--gpu", action="store_true", help="run the accelerator table (needs a CUDA JAX and torch)")
    gpu.add_argument("--lengths", type=int, nargs="+", default=[512, 8192],
                     help="maximum lengths (default 512 8192; each model runs the lengths its positions allow)")
    gpu.add_argument("--long-texts", type=int, default=512,
                     help="texts per setting at lengths above 512 (default 512; the paper's is 8192)")
    gpu.add_argument("--hf-batch", type=int, default=None,
                     help="texts per transformers / st batch (default: bertjax's rows per full-length batch)")
    gpu.add_argument("--repeats", type=int, default=1, help="timed passes per measurement (the median is kept)")
    gpu.add_argument("--attention", default="auto", help="bertjax's attention implementation (default auto)")
    gpu.add_argument("--json", metavar="FILE", help="write every measurement here (rewritten as they come)")
    gpu.add_argument("--dry-run", action="store_true",
                     help="with --gpu: run its code path on CPU (tiny --texts/--long-texts/--lengths) to check it")
    args = parser.parse_args(argv)
    if args.dry_run and not args.gpu:
        parser.error("--dry-run checks the --gpu path on CPU: give --gpu too")
    if args.gpu and args.cpu_time:
        parser.error("--cpu-time is for CPU runs; --gpu times wall clock with the device drained")
    if args.gpu and "--max-length" in argv:
        parser.error("--gpu takes --lengths (default 512 8192), not --max-length")
    if min(args.repeats, args.long_texts, args.texts or 1, args.hf_batch or 1) <= 0:
        parser.error("--texts, --long-texts, --hf-batch and --repeats must be positive")
    args.texts = args.texts or (8192 if args.gpu else 2000)
    args.systems = args.systems or (["bertjax", "transformers"] if args.gpu else ["bertjax", "st", "transformers"])
    return args


def main(argv=None) -> None:
    args = parse_args(argv)

    from bertjax.platforms import quiet_start

    quiet_start()  # no libtpu probing on a CPU machine
    import jax
    import torch

    if args.dry_run:
        jax.config.update("jax_platforms", "cpu")  # also on a GPU machine: the dry run is the CPU check
    device = "cpu"
    if args.gpu and not args.dry_run:
        if jax.default_backend() != "gpu":
            raise SystemExit(f"--gpu: JAX sees no GPU here (jax.default_backend() is {jax.default_backend()!r}); "
                             "run it on a GPU host, or add --dry-run to check the code path on CPU")
        if not torch.cuda.is_available():
            raise SystemExit("--gpu: torch sees no CUDA device (torch.cuda.is_available() is False); "
                             "transformers would not run on the GPU")
        device = "cuda"
    if args.cpu_time:
        torch.set_num_threads(1)
    vocab = [f"w{i}" for i in range(4000)]
    load = ' '.join(open('/proc/loadavg').read().split()[:3]) if os.path.exists('/proc/loadavg') else '?'
    if args.gpu:
        import transformers

        transformers.utils.logging.disable_progress_bar()  # the device returns only the output's last 12,000 chars
        accelerator = torch.cuda.get_device_name() if device == "cuda" else "CPU (--dry-run)"
        header = (f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {accelerator}, "
                  f"{jax.devices()[0].device_kind}, load average {load}, jax {jax.__version__}, torch "
                  f"{torch.__version__}, transformers {transformers.__version__}; bfloat16; {args.texts:,} texts "
                  f"(<= {SHORT_CONTEXT} tokens) / {args.long_texts:,} (longer) per setting, max_tokens "
                  f"{args.max_tokens or 'default'}, attention {args.attention}, {args.repeats} timed pass(es)")
        print(header, flush=True)
        if args.sweep_max_tokens:
            return sweep_max_tokens(args, vocab, args.lengths, "bfloat16")
        return run_accelerator(args, vocab, device, header)
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load}, "
          f"jax {jax.__version__} ({jax.default_backend()}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '').strip()!r}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads); {args.texts} texts, max length "
          f"{args.max_length}, max_tokens {args.max_tokens or 'default'}", flush=True)
    if args.sweep_max_tokens:
        return sweep_max_tokens(args, vocab, [args.max_length], "float32")
    cpu_table(args, vocab)


if __name__ == "__main__":
    main()
