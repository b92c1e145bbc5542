"""CPU throughput of XLNet-base in bertjax vs transformers (XLNetModel / XLNetLMHeadModel, eager: transformers'
XLNet has no sdpa path) on the same weights, and vs bertjax's BERT-base as the cost of the two streams and the
relative terms; forward and one training step, same run.

    python -m bench.xlnet_bench [--shapes 8x128 2x512] [--steps-shape 8x128]

Forward: the bare encoder (content stream). Train step: permutation LM as the `permutation_lm` objective trains it
(1/6 of the tokens predicted through the query stream, perm_mask and target_mapping from
bertjax.train.objectives.permutation), forward + backward + AdamW; transformers runs XLNetLMHeadModel on the same
perm_mask/target_mapping; BERT-base runs MLM at the same number of predicted positions. Tokens/s counts every
position of the batch.
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
from bertjax.train.objectives.permutation import sample_permutation

RATIO = 6


def _models(name: str):
    config = bertjax.get_config(name, dropout_rate=0.0)
    # The forward times the bare encoder on the LM's parameters: without BERT's pooler, which they do not hold.
    encoder, lm = bertjax.EncoderModel(config.replace(pooler=False)), bertjax.EncoderForMaskedLM(config)
    params = bertjax.init_params(lm, jax.random.key(0))
    return config, encoder, lm, params


def _train_step(lm, optimizer, loss_fn):
    def step(params, opt_state, *inputs):
        loss, grads = jax.value_and_grad(loss_fn)(params, *inputs)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(step, donate_argnums=(0, 1))


def bench_shape(batch: int, seq: int, repeats: int, train: bool, xl, bert, torch_models) -> None:
    import torch

    rng = np.random.default_rng(0)
    ids = rng.integers(6, 32000, (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    j_ids, j_mask = jnp.asarray(ids), jnp.asarray(mask)
    t_ids, t_mask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
    tokens = batch * seq
    results = {}
    torch_encoder, torch_lm = torch_models

    torch_models[0].eval()
    for name, (config, encoder, lm, params) in (("xlnet-base", xl), ("bert-base", bert)):
        forward = jax.jit(lambda p, i, m, enc=encoder: enc.apply({"params": p}, i, attention_mask=m).last_hidden_state)
        results[f"bertjax {name} forward"] = median_call(
            lambda: forward(params, j_ids, j_mask).block_until_ready(), repeats)[0]  # wall seconds

    def torch_forward():
        with torch.no_grad():
            torch_encoder(input_ids=t_ids, attention_mask=t_mask)
    results["transformers xlnet-base forward"] = median_call(torch_forward, repeats)[0]
    with torch.no_grad():
        diff = np.abs(np.asarray(jax.jit(xl[1].apply)({"params": xl[3]}, j_ids, attention_mask=j_mask)
                                 .last_hidden_state) - torch_encoder(input_ids=t_ids, attention_mask=t_mask)
                      .last_hidden_state.numpy()).max()

    if train:
        num_predict = -(-seq // RATIO)
        plm = sample_permutation(jax.random.key(1), j_mask, ratio=RATIO, max_span=5, num_predict=num_predict)
        labels = jnp.take_along_axis(j_ids, plm.target_positions, axis=1)
        optimizer = optax.adamw(1e-4)

        def xl_loss(p, i, perm, mapping, y, w):
            logits = xl[2].apply({"params": p}, i, perm_mask=perm, target_mapping=mapping).logits
            return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, y) * w) / jnp.sum(w)

        def bert_loss(p, i, positions, y, w):
            logits = bert[2].apply({"params": p}, i, masked_positions=positions).logits
            return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, y) * w) / jnp.sum(w)

        for name, loss_fn, inputs, model in (
                ("xlnet-base", xl_loss, (plm.perm_mask, plm.target_mapping, labels, plm.target_weights), xl),
                ("bert-base", bert_loss, (plm.target_positions, labels, plm.target_weights), bert)):
            step = _train_step(model[2], optimizer, loss_fn)
            state = [jax.tree.map(jnp.copy, model[3])]
            state.append(optimizer.init(state[0]))

            def run(step=step, inputs=inputs):
                state[0], state[1], loss = step(state[0], state[1], j_ids, *inputs)
                loss.block_until_ready()
            results[f"bertjax {name} train step"] = median_call(run, repeats)[0]

        perm_t, map_t = torch.from_numpy(np.asarray(plm.perm_mask)), torch.from_numpy(np.asarray(plm.target_mapping))
        labels_t = torch.from_numpy(np.asarray(labels).astype(np.int64))
        weights_t = torch.from_numpy(np.asarray(plm.target_weights))
        torch_opt = torch.optim.AdamW(torch_lm.parameters(), lr=1e-4)

        def torch_step():
            torch_opt.zero_grad()
            logits = torch_lm(input_ids=t_ids, perm_mask=perm_t, target_mapping=map_t).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels_t.flatten(), reduction="none")
            (loss * weights_t.flatten()).sum().div(weights_t.sum()).backward()
            torch_opt.step()
        torch_lm.train()
        results["transformers xlnet-base train step"] = median_call(torch_step, repeats)[0]

    print(f"\n{batch}x{seq} (max |diff| of the XLNet forward vs transformers: {diff:.1e})", flush=True)
    for kind in ("forward", "train step"):
        ours = results.get(f"bertjax xlnet-base {kind}")
        if ours is None:
            continue
        theirs, bert_time = results[f"transformers xlnet-base {kind}"], results[f"bertjax bert-base {kind}"]
        print(f"  {kind:10s} bertjax xlnet {tokens / ours:8.0f} tok/s | transformers xlnet {tokens / theirs:8.0f} tok/s"
              f" ({theirs / ours:.2f}x) | bertjax bert-base {tokens / bert_time:8.0f} tok/s (xlnet costs "
              f"{ours / bert_time:.2f}x bert)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8x128", "2x512"])
    parser.add_argument("--steps-shape", nargs="+", default=["8x128"], help="shapes that also time a train step")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch
    import transformers

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; jax {jax.__version__} "
          f"({jax.default_backend()}); torch {torch.__version__} ({torch.get_num_threads()} threads); "
          f"transformers {transformers.__version__}", flush=True)
    xl, bert = _models("xlnet-base"), _models("bert-base")
    with tempfile.TemporaryDirectory() as tmp:
        bertjax.save_pretrained(tmp, xl[2], xl[3])
        torch_lm = transformers.XLNetLMHeadModel.from_pretrained(tmp, attn_implementation="eager")
    torch_lm.config.use_mems_eval = torch_lm.config.use_mems_train = False
    torch_encoder = torch_lm.transformer.eval()
    for shape in args.shapes:
        batch, seq = (int(v) for v in shape.split("x"))
        bench_shape(batch, seq, args.repeats, shape in args.steps_shape, xl, bert, (torch_encoder, torch_lm))


if __name__ == "__main__":
    main()
