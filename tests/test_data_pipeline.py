"""The whole pipeline: batch format, determinism across threads and worker processes, exact resume, per-process
disjointness, every token exactly once, dynamic masks per epoch, NSP/SOP, evaluation batches, bad inputs."""

import collections
import json
import re

import numpy as np
import pytest
from pydoc_data.topics import topics

from bertjax.data.default_corpus import in_split
from bertjax.data.masking import MaskingVocab
from bertjax.data.pipeline import DataConfig, batch_spec, build_eval_iterator, build_pretraining_iterator
from bertjax.data.sources import InMemorySource
from bertjax.data.tokenizer_training import train_sentencepiece
from bertjax.data.windows import WindowPlan
from bertjax.ops import segment_positions

# ~1000 real English paragraphs (the pydoc topics), no corpus build needed.
PARAGRAPHS = [p.strip() for name in sorted(topics) for p in re.split(r"\n\s*\n", topics[name]) if p.strip()][:1000]
SEED = 5


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_sentencepiece(PARAGRAPHS, tmp_path_factory.mktemp("tok"), vocab_size=600)


def config(**changes) -> DataConfig:
    base = DataConfig(seq_len=64, global_batch_size=8, window_documents=100, worker_threads=0)
    return base.replace(**changes)


def source(split="all", texts=PARAGRAPHS):
    return InMemorySource(texts, split=split, eval_fraction=0.1)


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def unmasked(batch):
    """The row tokens before masking: the labels put back at the masked positions."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return ids


def test_batch_format(tokenizer):
    cfg = config()
    batches = take(build_pretraining_iterator(cfg, tokenizer, seed=SEED, source=source()), 5)
    spec = batch_spec(cfg)
    for batch in batches:
        assert set(batch) == set(spec)
        for name, (shape, dtype) in spec.items():
            assert batch[name].shape == shape and batch[name].dtype == dtype, name
        # Training rows always hold data; positions restart at each document's [CLS].
        assert np.all(batch["segment_ids"][:, 0] == 1)
        original = unmasked(batch)
        starts = original == tokenizer.cls_id
        np.testing.assert_array_equal(batch["positions"][starts], 0)
        assert np.all(batch["masked_weights"].sum(1) <= cfg.predictions_per_row)
        # Independent reference for the positions: the model's own derivation from segment ids.
        real = batch["segment_ids"] > 0
        derived = np.asarray(segment_positions(batch["segment_ids"]))
        np.testing.assert_array_equal(batch["positions"][real], derived[real])


def test_same_batches_whatever_the_threads_and_processes(tokenizer):
    reference = take(build_pretraining_iterator(config(), tokenizer, seed=SEED, source=source()), 12)
    threads = take(build_pretraining_iterator(config(worker_threads=3), tokenizer, seed=SEED, source=source()), 12)
    assert_same_batches(reference, threads)
    iterator = build_pretraining_iterator(config(worker_processes=2), tokenizer, seed=SEED, source=source())
    try:
        assert_same_batches(reference, take(iterator, 12))
    finally:
        iterator.close()
    with pytest.raises(ValueError, match="closed"):
        next(iterator)
    other_seed = take(build_pretraining_iterator(config(), tokenizer, seed=SEED + 1, source=source()), 1)
    assert not np.array_equal(other_seed[0]["input_ids"], reference[0]["input_ids"])


@pytest.mark.parametrize("consumed", [7, 23])
def test_resume_gives_exactly_the_next_batches(tokenizer, consumed):
    # Two epochs of ~4 windows each: 23 batches in crosses windows and the epoch boundary.
    cfg = config(num_epochs=2, window_documents=300)
    iterator = build_pretraining_iterator(cfg, tokenizer, seed=SEED, source=source())
    take(iterator, consumed)
    state = json.loads(json.dumps(iterator.get_state()))
    expected = take(iterator, 6)
    restored = build_pretraining_iterator(cfg.replace(worker_threads=2), tokenizer, seed=SEED, source=source())
    restored.set_state(state)
    assert_same_batches(expected, take(restored, 6))
    with pytest.raises(ValueError, match="lacks"):
        restored.set_state({"window": 0})


def test_each_epoch_reshuffles_and_remasks(tokenizer):
    texts = PARAGRAPHS[:120]
    # One window holds the whole epoch and documents are not shuffled: every epoch packs the same rows (in
    # another order), and each row must get a fresh mask.
    cfg = config(shuffle=False, num_epochs=2, window_documents=1000, global_batch_size=1)
    batches = list(build_pretraining_iterator(cfg, tokenizer, seed=SEED, source=source(texts=texts)))
    half = len(batches) // 2
    assert len(batches) == 2 * half and half > 10
    masks = [{unmasked(b).tobytes(): b["masked_positions"].tobytes() for b in epoch}
             for epoch in (batches[:half], batches[half:])]
    assert masks[0].keys() == masks[1].keys()
    changed = sum(masks[0][row] != masks[1][row] for row in masks[0])
    assert changed > 0.9 * half
    shuffled = list(build_pretraining_iterator(cfg.replace(shuffle=True), tokenizer, seed=SEED,
                                               source=source(texts=texts)))
    rows = [{unmasked(b).tobytes() for b in epoch} for epoch in (shuffled[:half], shuffled[half:])]
    assert rows[0] != rows[1], "reshuffled documents pack into other rows"


def token_counts(tokenizer, texts):
    counts = collections.Counter()
    for ids in tokenizer.encode_batch(texts):
        counts.update(ids.tolist())
    return counts


def row_token_counts(batches, tokenizer):
    counts = collections.Counter()
    for batch in batches:
        ids = unmasked(batch)
        real = (batch["segment_ids"] > 0) & ~np.isin(ids, tokenizer.special_ids)
        counts.update(ids[real].tolist())
    return counts


def test_every_token_exactly_once_and_disjoint_processes(tokenizer):
    texts = PARAGRAPHS[:400]
    expected = token_counts(tokenizer, texts)
    cfg = config(num_epochs=1, global_batch_size=3, window_documents=64)
    seen = collections.Counter()
    for process in range(3):
        # One row per batch and per process: no partial batch is dropped at the end of the epoch.
        iterator = build_pretraining_iterator(cfg, tokenizer, seed=SEED, process_index=process, process_count=3,
                                              source=source(texts=texts))
        seen += row_token_counts(iterator, tokenizer)
        assert iterator.stats.counts["documents"] in (133, 134)
    assert seen == expected
    # The document shares themselves: disjoint, and together the whole epoch.
    shares = []
    for process in range(3):
        plan = WindowPlan(len(texts), 64, process, 3, shuffle=True, seed=SEED)
        shares.append(np.concatenate([plan.document_indices(w) for w in range(plan.windows_per_epoch)]))
    assert sorted(np.concatenate(shares).tolist()) == list(range(len(texts)))


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_sentence_objectives(tokenizer, objective):
    cfg = config(packing="pad", sentence_objective=objective, global_batch_size=32)
    batches = take(build_pretraining_iterator(cfg, tokenizer, seed=SEED, source=source()), 20)
    labels = np.concatenate([b["nsp_labels"] for b in batches])
    assert labels.dtype == np.int32 and set(np.unique(labels)) == {0, 1}
    assert abs(labels.mean() - 0.5) < 0.06
    for batch in batches:
        assert np.all(batch["token_type_ids"].max(axis=1) == 1)
        assert np.all(batch["segment_ids"].max(axis=1) == 1)
    with pytest.raises(ValueError, match="sentence_objective='nsp' needs packing='pad'"):
        config(sentence_objective="nsp")


def test_eval_batches_are_finite_deterministic_and_padded(tokenizer):
    cfg = config(sentence_objective="nsp", packing="pad")
    held_out = source(split="eval")
    a = list(build_eval_iterator(cfg, tokenizer, source=held_out))
    b = list(build_eval_iterator(cfg.replace(worker_threads=2), tokenizer, source=held_out))
    assert_same_batches(a, b)
    last = a[-1]
    padding = last["segment_ids"].max(axis=1) == 0
    assert np.all(last["masked_weights"][padding] == 0) and np.all(last["nsp_labels"][padding] == -1)
    fixed = list(build_eval_iterator(cfg.replace(eval_batches=len(a) + 3), tokenizer, source=held_out))
    assert len(fixed) == len(a) + 3
    assert all(np.all(batch["segment_ids"] == 0) for batch in fixed[len(a):])
    assert len(list(build_eval_iterator(cfg.replace(eval_batches=2), tokenizer, source=held_out))) == 2
    # More processes than held-out documents: the processes without any still yield the same number of batches.
    few = source(split="eval", texts=[t for t in PARAGRAPHS if in_split(t, "eval", 0.1)][:2])
    counts = [len(list(build_eval_iterator(cfg.replace(eval_batches=3, global_batch_size=12), tokenizer,
                                           process_index=p, process_count=3, source=few))) for p in range(3)]
    assert counts == [3, 3, 3]
    with pytest.raises(ValueError, match="process 2 of 3 gets no train documents"):
        build_pretraining_iterator(config(global_batch_size=3), tokenizer, seed=0, process_index=2,
                                   process_count=3, source=source(texts=PARAGRAPHS[:2]))


def test_bad_documents_never_break_a_batch(tokenizer):
    long_document = " ".join(PARAGRAPHS[:30])  # far longer than a row: split over several rows
    texts = ["\u200b", "ok " * 3, long_document, "\u200b\u200c", *PARAGRAPHS[:50]]
    iterator = build_pretraining_iterator(config(num_epochs=1, global_batch_size=1), tokenizer, seed=SEED,
                                          source=source(texts=texts + ["   "]))
    batches = list(iterator)
    assert all(b["input_ids"].shape == (1, 64) for b in batches)
    counts = iterator.stats.counts
    assert counts["empty_after_tokenization"] == 2
    assert counts["documents_split"] >= 1
    assert iterator.stats.source.skipped == {"empty_document": 1}
    assert row_token_counts(batches, tokenizer) == token_counts(tokenizer, texts)
    assert "2 empty after tokenization" in iterator.stats.report()


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="DataConfig.seq_len"):
        DataConfig(seq_len=0)
    with pytest.raises(ValueError, match="DataConfig.seq_len must be int, got"):
        DataConfig(seq_len="128")
    with pytest.raises(ValueError, match="DataConfig.masking"):
        DataConfig(masking="words")
    with pytest.raises(ValueError, match="DataConfig.mlm_probability"):
        DataConfig(mlm_probability=1.5)
    with pytest.raises(ValueError, match="divisible"):
        DataConfig(global_batch_size=10).batch_size_per_process(4)
    assert DataConfig(seq_len=512, mlm_probability=0.3).predictions_per_row == 154


def test_a_prediction_cap_below_the_masking_rate_is_said():
    """ALBERT's released flags (20 predictions at 512 tokens) mask about 4% of a full row: the run says so."""
    albert = DataConfig(seq_len=512, mlm_probability=0.15, max_predictions=20)
    assert albert.capped_masking_note() == (
        "data.max_predictions=20 caps the masking of a full 512-token row at 3.9%, below data.mlm_probability=0.15 "
        "(77 predictions); leave max_predictions unset for the full rate")
    assert DataConfig(seq_len=512, mlm_probability=0.15).capped_masking_note() is None
    assert DataConfig(seq_len=128, mlm_probability=0.15, max_predictions=20).capped_masking_note() is None  # BERT's


def test_masking_follows_the_tokenizers_specials_end_to_end(tokenizer):
    """The pipeline builds its masking vocabulary from the real tokenizer (`MaskingVocab.from_tokenizer`), and
    hand-built vocabularies in test_data_masking cannot see that link. The reference is the tokenizer's own named
    ids ([CLS] [SEP] [PAD] [MASK] [UNK]) and `special_ids`. No special may ever be a target (each row's [CLS] and
    [SEP] are in every batch). No "random" replacement may be a special either. A high rate with only random
    replacements gives thousands of draws, so even a few specials among 600 ids would be drawn."""
    named = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id, tokenizer.unk_id}
    specials = np.asarray(tokenizer.special_ids)
    assert named <= set(specials.tolist())
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    np.testing.assert_array_equal(np.flatnonzero(vocab.is_special), np.sort(specials))
    for mask_fraction, random_fraction in [(0.8, 0.1), (0.0, 1.0)]:
        cfg = config(seq_len=128, global_batch_size=16, mlm_probability=0.5, mask_token_fraction=mask_fraction,
                     random_token_fraction=random_fraction)
        batches = take(build_pretraining_iterator(cfg, tokenizer, seed=SEED, source=source()), 3)
        draws = 0
        for batch in batches:
            original = unmasked(batch)
            assert np.any(np.isin(original, [tokenizer.cls_id, tokenizer.sep_id]))
            rows, slots = np.nonzero(batch["masked_weights"])
            positions = batch["masked_positions"][rows, slots]
            labels = batch["masked_ids"][rows, slots]
            corrupted = batch["input_ids"][rows, positions]
            assert not np.isin(labels, specials).any(), "a special token is an MLM target"
            np.testing.assert_array_equal(labels, original[rows, positions])
            replaced = corrupted != tokenizer.mask_id
            assert not np.isin(corrupted[replaced], specials).any(), "a special token was drawn as a random token"
            draws += int((corrupted != labels).sum())
        if random_fraction == 1.0:
            assert draws > 2000  # the draws are many: a special among them would be seen
