"""Weight decay leaves alone the parameters a loss does not depend on, as PyTorch's optimizers do (their `.grad` is
None there): bertjax/train/unused_params.py finds them in the traced loss; pretraining, fine-tuning and the embedder
pass them to the optimizer. The reference for which parameters those are is torch's autograd on the transformers
model."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.train.optimizers import OPTIMIZERS, build_optimizer
from bertjax.train.run_config import OptimizerConfig
from bertjax.train.unused_params import unused_parameters


def test_only_parameters_with_a_path_to_the_loss_are_used():
    """A parameter is used when the loss depends on it through any operation, also one that gives it a zero
    gradient (a column sliced away), and unused when nothing reaches the loss: never read, read into a discarded
    result, or passed into a jit or remat that ignores it. A scan's operands all count as used."""
    params = {name: jnp.ones((3, 3)) for name in ("read", "sliced_away", "never_read", "discarded", "jit_ignores",
                                                  "remat_ignores", "scan_ignores")}

    @jax.jit
    def jitted(x, ignored):
        return x * 2.0

    @jax.checkpoint
    def rematted(x, ignored):
        return jnp.tanh(x)

    def loss(p, x):
        y = x @ p["read"]
        _ = jnp.sin(x @ p["discarded"])
        y = y + (x @ p["sliced_away"])[:, :1]  # columns 1 and 2 get a zero gradient, as in torch
        y = rematted(jitted(y, p["jit_ignores"]), p["remat_ignores"])
        return jax.lax.scan(lambda carry, w: (carry + jnp.sum(y), None), 0.0, p["scan_ignores"])[0]

    unused = unused_parameters(loss, params, jnp.ones((2, 3)))
    assert unused == {"never_read", "discarded", "jit_ignores", "remat_ignores"}
    grads = jax.grad(loss)(params, jnp.ones((2, 3)))
    assert all(not np.any(grads[name]) for name in unused)  # what the analysis says is, at least, gradient-free
    assert np.any(grads["sliced_away"]) and not np.any(grads["sliced_away"][:, 1:])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_leaves_unused_parameters_as_they_are(name):
    """With weight decay and a zero gradient, a parameter the loss uses shrinks (decoupled decay) and one it does
    not use stays bit for bit, as torch.optim.AdamW leaves a parameter whose .grad is None."""
    config = OptimizerConfig(name=name, learning_rate=0.1, weight_decay=0.5)
    optimizer = build_optimizer(config, 0.1, frozenset({"head/unused/kernel"}))
    params = {"head": {"used": {"kernel": jnp.full((4, 4), 0.5)}, "unused": {"kernel": jnp.full((4, 4), 0.5)}}}
    state = optimizer.init(params)
    for _ in range(3):
        updates, state = optimizer.update(jax.tree.map(jnp.zeros_like, params), state, params)
        params = optax.apply_updates(params, updates)
    assert np.all(np.asarray(params["head"]["used"]["kernel"]) < 0.5)
    np.testing.assert_array_equal(params["head"]["unused"]["kernel"], np.full((4, 4), 0.5))


def _torch_parameters_without_grad(model, **inputs) -> set[str]:
    """Names of the transformers model's parameters left with .grad None by a backward pass of its loss."""
    model.train()
    model(**inputs).loss.backward()
    return {name for name, p in model.named_parameters() if p.grad is None}


def _global_projection_paths(torch_names: set[str]) -> set[str]:
    """transformers Longformer names of the global q/k/v projections as bertjax parameter paths."""
    pattern = re.compile(r"(?:longformer\.)?encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)_global\."
                         r"(weight|bias)")
    paths = set()
    for name in torch_names:
        found = pattern.fullmatch(name)
        assert found, name  # nothing else is left without a gradient
        layer, projection, kind = found.groups()
        paths.add(f"encoder/layers_{layer}/attention/{projection}_global/{'kernel' if kind == 'weight' else 'bias'}")
    return paths


@pytest.fixture(scope="module")
def longformer_global_projections(tmp_path_factory):
    """The bertjax paths of the parameters torch leaves without a gradient in a Longformer MLM step with no global
    attention, from a tiny model written by bertjax and read by transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from finetune_helpers import tiny_model_dir

    directory = tiny_model_dir(tmp_path_factory.mktemp("longformer") / "model", "longformer-tiny",
                               position_offset=1)  # padding id 0
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory)
    ids = torch.tensor(np.random.default_rng(0).integers(5, 20, (2, 16)))
    missing = _torch_parameters_without_grad(model, input_ids=ids, labels=ids)
    paths = _global_projection_paths(missing)
    assert len(paths) == 6 * model.config.num_hidden_layers
    return directory, paths


def _captured_unused(monkeypatch, module) -> dict:
    """Replaces `module.build_optimizer` by one that records the `unused` it is given and stops the run there."""
    captured = {}

    class Captured(Exception):
        pass

    def capture(config, schedule, unused=frozenset()):
        captured["unused"] = set(unused)
        raise Captured

    monkeypatch.setattr(module, "build_optimizer", capture)
    captured["stop"] = Captured
    return captured


def test_longformer_pretraining_skips_the_global_projections_as_torch_does(longformer_global_projections,
                                                                             monkeypatch):
    """configs/pretrain/longformer-base.yaml trains MLM with no global token: its global projections (copied from
    the local ones by init_from) are never read, so they keep their values where decay would shrink them ~1%."""
    import bertjax.train.setup as setup_module
    from bertjax.train.run_config import load_run_config

    _, expected = longformer_global_projections
    captured = _captured_unused(monkeypatch, setup_module)
    config = load_run_config("configs/pretrain/longformer-base.yaml", [
        "model.preset=longformer-tiny", "model.init_from=null", "model.overrides={}", "tokenizer.vocab_size=128",
        "data.global_batch_size=4", "data.seq_len=32"])
    with pytest.raises(captured["stop"]):
        setup_module.setup_run(config, vocab_size=128, pad_id=1)
    assert captured["unused"] == expected


@pytest.mark.parametrize("task, global_tokens", [("token-classification", False), ("sequence-classification", True)])
def test_longformer_fine_tuning_skips_the_global_projections_when_no_token_attends_globally(
        longformer_global_projections, tmp_path, monkeypatch, task, global_tokens):
    """Token classification has no global tokens (transformers' LongformerForTokenClassification neither): the
    global projections do not decay. Sequence classification attends globally from the first token: they do."""
    import bertjax.finetune.trainer as trainer
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from finetune_helpers import sentiment_rows, write_jsonl

    directory, expected = longformer_global_projections
    captured = _captured_unused(monkeypatch, trainer)
    rows = sentiment_rows(8, 0)
    if task == "token-classification":
        rows = [{"tokens": row["text"].split(), "tags": ["B-CUE" if i % 3 == 0 else "O"
                                                          for i, _ in enumerate(row["text"].split())]} for row in rows]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    config = load_finetune_config(None, ["train.batch_size=4", "data.max_length=16",
                                                 "train.weight_decay=0.01"], task_class(task).defaults)
    with pytest.raises(captured["stop"]):
        trainer.finetune(directory, task_class(task), data, data, tmp_path / "run", config, say=lambda _: None)
    assert captured["unused"] == (set() if global_tokens else expected)


def test_xlnet_fine_tuning_keeps_mask_emb_as_torch_does(tmp_path, monkeypatch):
    """XLNet's mask_emb starts the query stream, which only a target mapping asks for: torch leaves it without a
    gradient in XLNetForSequenceClassification, and bertjax's fine-tuning does not decay it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import bertjax.finetune.trainer as trainer
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from finetune_helpers import sentiment_rows, tiny_model_dir, write_jsonl

    directory = tiny_model_dir(tmp_path / "model", "xlnet-tiny")
    reference = transformers.XLNetForSequenceClassification.from_pretrained(directory, num_labels=2)
    ids = torch.tensor(np.random.default_rng(0).integers(5, 20, (2, 12)))
    # With token types, as XLNet's tokenizer always gives them (without, the segment biases get no gradient either).
    assert _torch_parameters_without_grad(reference, input_ids=ids, token_type_ids=torch.zeros_like(ids),
                                          labels=torch.tensor([0, 1])) == {"transformer.mask_emb"}
    captured = _captured_unused(monkeypatch, trainer)
    data = write_jsonl(tmp_path / "data.jsonl", sentiment_rows(8, 0))
    config = load_finetune_config(None, ["train.batch_size=4", "data.max_length=16"],
                                          task_class("sequence-classification").defaults)
    with pytest.raises(captured["stop"]):
        trainer.finetune(directory, task_class("sequence-classification"), data, data, tmp_path / "run", config,
                         say=lambda _: None)
    assert captured["unused"] == {"encoder/mask_emb"}


def test_embedder_on_a_longformer_skips_the_global_projections(longformer_global_projections, tmp_path,
                                                                monkeypatch):
    """train-embedder on a Longformer (mean pooling, no global tokens): the global projections do not decay."""
    import bertjax.embeddings.training as training
    from bertjax.embeddings.train_config import embedder_config_from_dict
    from finetune_helpers import write_jsonl

    directory, expected = longformer_global_projections
    captured = _captured_unused(monkeypatch, training)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": f"good {i}", "positive": f"fine {i}"}
                                                   for i in range(8)])
    config = embedder_config_from_dict({"train": {"batch_size": 4, "steps": 1, "progress_bar": False}})
    with pytest.raises(captured["stop"]):
        training.train_embedder(config, tmp_path / "run", directory, pairs)
    assert captured["unused"] == expected


def test_a_longformer_tagger_trains_with_its_global_projections_as_loaded_and_says_so(longformer_global_projections,
                                                                                       tmp_path):
    """End to end, with a large weight decay: the tagger written to best/ holds the loaded global projections bit
    for bit while the local ones have moved, and the run said which parameters weight decay skips."""
    import bertjax
    from bertjax.finetune.config import load_finetune_config
    from bertjax.finetune.tasks import task_class
    from bertjax.finetune.trainer import finetune
    from finetune_helpers import sentiment_rows, write_jsonl
    from flax import traverse_util

    directory, expected = longformer_global_projections
    rows = [{"tokens": row["text"].split(), "tags": ["B-CUE" if i % 3 == 0 else "O"
                                                      for i, _ in enumerate(row["text"].split())]}
            for row in sentiment_rows(8, 0)]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    task = task_class("token-classification")
    config = load_finetune_config(None, ["train.batch_size=4", "data.max_length=16", "train.epochs=1",
                                         "train.learning_rate=1e-2", "train.weight_decay=0.5",
                                         "train.warmup_ratio=0", "train.progress_bar=false"], task.defaults)
    said = []
    finetune(directory, task, data, data, tmp_path / "run", config, say=said.append)
    assert any(line.startswith(f"weight decay skips {len(expected)} parameter(s) the loss does not depend on")
               for line in said), said
    loaded = traverse_util.flatten_dict(bertjax.from_pretrained(str(directory))[1], sep="/")
    trained = traverse_util.flatten_dict(bertjax.from_pretrained(str(tmp_path / "run" / "best"))[1], sep="/")
    for path in expected:
        np.testing.assert_array_equal(trained[path], loaded[path], err_msg=path)
    local = "encoder/layers_0/attention/query/kernel"
    assert not np.array_equal(trained[local], loaded[local])


def test_longformer_pretraining_keeps_the_global_projections_and_says_so(tmp_path, capsys):
    """`pretrain` of a tiny Longformer (MLM, no global token), AdamW with a large weight decay: after 4 steps the
    global projections are their initial values bit for bit, the local ones have moved, and the run said so."""
    from bertjax.train import pretrain
    from bertjax.train.run_config import load_run_config
    from bertjax.train.setup import setup_run
    from train_helpers import TINY_RUN, small_tokenizer, write_config

    config = load_run_config(str(write_config(
        tmp_path / "run.yaml", small_tokenizer(),
        model={"preset": "longformer-tiny", "overrides": {"max_position_embeddings": 66, "position_offset": 1}},
        optimizer={"name": "adamw", "learning_rate": 1e-2, "weight_decay": 0.5},
        schedule={"warmup": 1, "decay": 1}, train={**TINY_RUN["train"], "steps": 4})), [])
    result = pretrain(config, tmp_path / "workdir")
    assert "weight decay skips 12 parameter(s) the loss does not depend on" in capsys.readouterr().out
    initial = setup_run(config, vocab_size=result.tokenizer.vocab_size, pad_id=result.tokenizer.pad_id).fresh_state()
    for layer in range(2):
        attention = lambda params: params["encoder"][f"layers_{layer}"]["attention"]  # noqa: E731
        for name in ("query_global", "key_global", "value_global"):
            np.testing.assert_array_equal(attention(result.params)[name]["kernel"],
                                          attention(initial.params)[name]["kernel"])
        assert not np.array_equal(attention(result.params)["query"]["kernel"],
                                  attention(initial.params)["query"]["kernel"])
