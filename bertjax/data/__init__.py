"""Pretraining data: text -> tokenizer -> Grain windows (pack, mask) -> per-process batches -> global arrays.

Files, in the order data flows through them:
    sources.py          documents from text / JSONL / Parquet files, prepared ArrayRecord, or the default corpus
    default_corpus.py   the embedded corpus: the Python interpreter's own English documentation (~5 MB)
    tokenizers.py       one Tokenizer interface; SentencePiece, tokenizer.json, WordPiece vocab.txt; load_tokenizer
    tokenizer_training.py  train a SentencePiece model with BERT's special tokens (train_default_tokenizer)
    packing.py          documents -> fixed-length rows (packed with best-fit, or padded), segment ids, positions
    nsp.py              sentence-pair rows for NSP / SOP
    masking.py          dynamic MLM masks: token, whole-word, span; 80/10/10; fixed max predictions per row
    windows.py          one window of documents -> finished rows (the parallel unit of work)
    batching.py         rows -> batches; the checkpointable iterator
    pipeline.py         DataConfig, build_pretraining_iterator, build_eval_iterator, batch_spec
    global_batch.py     per-process batches -> global jax.Arrays over the mesh
    prepare.py          tokenize once to ArrayRecord (`bertjax prepare`)

Batch format (what `next(iterator)` returns on each process): a dict of numpy arrays, B = global_batch_size /
process_count rows, S = seq_len, P = max predictions per row (`DataConfig.predictions_per_row`):

    input_ids        int32 [B, S]  token ids after masking ([MASK] / random / kept at the masked positions)
    segment_ids      int32 [B, S]  0 = padding; packed documents numbered 1..k within each row (attention stays
                                   inside a document); with NSP/SOP the whole pair is segment 1
    positions        int32 [B, S]  0 at each document's [CLS], counting up within the document; 0 on padding.
                                   Equal to `bertjax.ops.segment_positions(segment_ids)` on real tokens; add
                                   `EncoderConfig.position_offset` (RoBERTa: 2) before passing them as
                                   `position_ids`, or pass only segment_ids and let the model derive them
    token_type_ids   int32 [B, S]  0, or 1 for the B sentence of an NSP/SOP pair
    masked_positions int32 [B, P]  where the predictions are, ascending; padding slots hold 0
    masked_ids       int32 [B, P]  the original tokens there: the MLM labels; padding slots hold 0
    masked_weights float32 [B, P]  1 for a real prediction, 0 for a padding slot
    nsp_labels       int32 [B]     only with sentence_objective "nsp"/"sop": NSP 0 = is next, 1 = random;
                                   SOP 0 = in order, 1 = swapped; -1 on the padding rows of evaluation batches

Every row of a training batch holds data. Evaluation batches may end with padding rows (all segment ids 0, all
weights 0). Iterators save and restore their position with `get_state()` / `set_state()` (a small JSON-able dict)
and report counts of what they read, skipped and packed in `iterator.stats`.

Names are imported lazily, so `bertjax.data.tokenizers` works on machines without grain installed.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DataConfig": "bertjax.data.pipeline",
    "build_pretraining_iterator": "bertjax.data.pipeline",
    "build_eval_iterator": "bertjax.data.pipeline",
    "batch_spec": "bertjax.data.pipeline",
    "Tokenizer": "bertjax.data.tokenizers",
    "load_tokenizer": "bertjax.data.tokenizers",
    "train_sentencepiece": "bertjax.data.tokenizer_training",
    "train_default_tokenizer": "bertjax.data.tokenizer_training",
    "default_corpus_documents": "bertjax.data.default_corpus",
    "open_documents": "bertjax.data.sources",
    "InMemorySource": "bertjax.data.sources",
    "prepare_corpus": "bertjax.data.prepare",
    "to_global_batch": "bertjax.data.global_batch",
    "batch_sharding": "bertjax.data.global_batch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bertjax.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
