"""CPU throughput of DeBERTa-v3-base in bertjax vs transformers (DebertaV2Model / DebertaV2ForMaskedLM, eager
attention: transformers' DeBERTa has no sdpa path) on the same weights, and vs bertjax's BERT-base as the cost of
the relative terms; forward and one training step, same run. Then the compiled memory of one disentangled
attention call against sequence length (dense vs blockwise).

    python -m bench.deberta_bench [--shapes 8x128 2x512] [--steps-shape 8x128] [--memory-seqs 512 1024 2048 4096]

Forward: the bare encoder. Train step: masked LM at 15% of the positions (the MLM head on the masked positions
only, on both sides), forward + backward + AdamW. Tokens/s counts every position of the batch.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

import bertjax
from bench.timing import median_call
from bertjax.ops.disentangled_attention import disentangled_attention

MASK_RATE = 0.15


def _models(name: str):
    config = bertjax.get_config(name, dropout_rate=0.0, pooler=False)  # the MLM tree has no pooler
    encoder, lm = bertjax.EncoderModel(config), bertjax.EncoderForMaskedLM(config)
    params = bertjax.init_params(lm, jax.random.key(0))
    return config, encoder, lm, params


def bench_shape(batch: int, seq: int, repeats: int, train: bool, deberta, bert, torch_lm) -> None:
    import torch

    rng = np.random.default_rng(0)
    ids = rng.integers(6, 30000, (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    j_ids, j_mask = jnp.asarray(ids), jnp.asarray(mask)
    t_ids, t_mask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
    tokens = batch * seq
    results = {}

    for name, (config, encoder, lm, params) in (("deberta-v3-base", deberta), ("bert-base", bert)):
        forward = jax.jit(lambda p, i, m, enc=encoder: enc.apply({"params": p}, i, attention_mask=m).last_hidden_state)
        results[f"bertjax {name} forward"] = median_call(lambda: forward(params, j_ids, j_mask).block_until_ready(),
                                                       repeats)
    torch_lm.eval()

    def torch_forward():
        with torch.no_grad():
            torch_lm.deberta(input_ids=t_ids, attention_mask=t_mask)
    results["transformers deberta-v3-base forward"] = median_call(torch_forward, repeats)
    with torch.no_grad():
        ours = jax.jit(deberta[1].apply)({"params": deberta[3]}, j_ids, attention_mask=j_mask).last_hidden_state
        diff = np.abs(np.asarray(ours) - torch_lm.deberta(input_ids=t_ids, attention_mask=t_mask)
                      .last_hidden_state.numpy()).max()

    if train:
        num_predict = max(1, round(seq * MASK_RATE))
        positions = np.sort(np.stack([rng.choice(seq, num_predict, replace=False) for _ in range(batch)]), 1)
        labels = np.take_along_axis(ids, positions, 1)
        j_pos, j_labels = jnp.asarray(positions, jnp.int32), jnp.asarray(labels)
        optimizer = optax.adamw(1e-4)

        for name, model in (("deberta-v3-base", deberta), ("bert-base", bert)):
            def loss_fn(p, i, pos, y, lm=model[2]):
                logits = lm.apply({"params": p}, i, masked_positions=pos).logits
                return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y))

            def step(params, opt_state, *inputs, loss_fn=loss_fn):
                loss, grads = jax.value_and_grad(loss_fn)(params, *inputs)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return optax.apply_updates(params, updates), opt_state, loss
            step = jax.jit(step, donate_argnums=(0, 1))
            state = [jax.tree.map(jnp.copy, model[3])]
            state.append(optimizer.init(state[0]))

            def run(step=step):
                state[0], state[1], loss = step(state[0], state[1], j_ids, j_pos, j_labels)
                loss.block_until_ready()
            results[f"bertjax {name} train step"] = median_call(run, repeats)
            del state

        rows = torch.arange(batch)[:, None]
        pos_t, labels_t = torch.from_numpy(positions), torch.from_numpy(labels.astype(np.int64))
        head = torch_lm.cls if torch_lm.legacy else torch_lm.lm_predictions
        torch_opt = torch.optim.AdamW(torch_lm.parameters(), lr=1e-4)
        torch_lm.train()

        def torch_step():  # the MLM head on the masked positions only, as bertjax's
            torch_opt.zero_grad()
            hidden = torch_lm.deberta(input_ids=t_ids, attention_mask=t_mask).last_hidden_state[rows, pos_t]
            logits = head(hidden) if torch_lm.legacy else head(hidden, torch_lm.deberta.embeddings.word_embeddings)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels_t.flatten()).backward()
            torch_opt.step()
        results["transformers deberta-v3-base train step"] = median_call(torch_step, repeats)

    print(f"\n{batch}x{seq} (max |diff| of the DeBERTa forward vs transformers: {diff:.1e})", flush=True)
    for kind in ("forward", "train step"):
        ours = results.get(f"bertjax deberta-v3-base {kind}")
        if ours is None:
            continue
        theirs, bert_time = results[f"transformers deberta-v3-base {kind}"], results[f"bertjax bert-base {kind}"]
        print(f"  {kind:10s} bertjax deberta {tokens / ours[0]:7.0f} tok/s | transformers deberta "
              f"{tokens / theirs[0]:7.0f} tok/s ({theirs[0] / ours[0]:.2f}x; CPU time {theirs[1] / ours[1]:.2f}x) | "
              f"bertjax bert-base {tokens / bert_time[0]:7.0f} tok/s (deberta costs {ours[0] / bert_time[0]:.2f}x "
              f"bert; CPU time {ours[1] / bert_time[1]:.2f}x)", flush=True)

def attention_memory(seqs: list[int], batch: int = 1) -> None:
    """Compiled temporary memory of one DeBERTa-v3-base attention call (12 heads x 64, 256 buckets -> 512 table
    rows, both terms), forward and forward + backward, dense vs blockwise (blocks of 128 query rows)."""
    h, d, span = 12, 64, 256
    print(f"\ncompiled temporaries of one disentangled attention call (batch {batch}, 12 heads x 64, c2p+p2c), MiB")
    print(f"  {'seq':>6} {'dense fwd':>10} {'blockwise fwd':>14} {'dense fwd+bwd':>14} {'blockwise fwd+bwd':>18}")
    for seq in seqs:
        row = []
        for grad in (False, True):
            for implementation in ("dense", "blockwise"):
                spec = jax.ShapeDtypeStruct((batch, seq, h, d), jnp.float32)
                table = jax.ShapeDtypeStruct((2 * span, h, d), jnp.float32)

                def fn(q, k, v, pk, pq, seg, implementation=implementation):
                    return disentangled_attention(q, k, v, pk, pq, segment_ids=seg, span=span, buckets=256,
                                                  max_position=512, implementation=implementation, block_size=128)
                if grad:
                    fn = jax.grad(lambda *a, f=fn: jnp.sum(f(*a)), argnums=(0, 1, 2, 3, 4))
                compiled = jax.jit(fn).lower(spec, spec, spec, table, table,
                                             jax.ShapeDtypeStruct((batch, seq), jnp.int32)).compile()
                row.append(compiled.memory_analysis().temp_size_in_bytes / 2**20)
        print(f"  {seq:6d} {row[0]:10.1f} {row[1]:14.1f} {row[2]:14.1f} {row[3]:18.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=["8x128", "2x512"])
    parser.add_argument("--steps-shape", nargs="*", default=["8x128"], help="shapes that also time a train step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-seqs", nargs="*", type=int, default=[512, 1024, 2048, 4096])
    args = parser.parse_args()
    import torch
    import transformers

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; jax {jax.__version__} ({jax.default_backend()}); torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); transformers {transformers.__version__}", flush=True)
    if args.shapes:
        deberta, bert = _models("deberta-v3-base"), _models("bert-base")
        with tempfile.TemporaryDirectory() as tmp:
            bertjax.save_pretrained(tmp, deberta[2], deberta[3])
            torch_lm = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp, attn_implementation="eager")
        for shape in args.shapes:
            batch, seq = (int(v) for v in shape.split("x"))
            bench_shape(batch, seq, args.repeats, shape in args.steps_shape, deberta, bert, torch_lm)
    if args.memory_seqs:
        attention_memory(args.memory_seqs)


if __name__ == "__main__":
    main()
