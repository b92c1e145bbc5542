"""Sentence embeddings: pooling per segment, sentence-transformers directories in and out, jitted embedding.

    from bertjax.embeddings import load_sentence_encoder, save_sentence_encoder
    encoder = load_sentence_encoder("model_dir")         # sentence-transformers, transformers or bertjax directory
    vectors = encoder.encode(["a query"], prompt_name="query")

Files:
    config.py                     PoolingConfig (modes, normalize, truncate_dim, include_prompt), DenseConfig
    model.py                      EncoderForEmbedding: backbone -> pool per segment -> Dense -> truncate -> normalise
    encoder.py                    SentenceEncoder: model + params + tokenizer + prompts; embed_rows, tokenize, encode
    embed.py                      Embedder: the fast path (packed rows, shape buckets, max_tokens, bf16, mesh, chunking)
    search.py                     exact top-k search over a saved embedding matrix (jitted, chunked)
    similarity.py                 cosine / dot / euclidean / manhattan, as sentence-transformers' similarity
    sentence_transformers_dir.py  load_sentence_encoder / save_sentence_encoder
Training (`bertjax train-embedder`):
    contrastive.py                in-batch ranking loss (one device, and over a mesh), GradCache
    pairs.py                      (anchor, positive[, negative]) files -> token arrays
    train_config.py               the typed run config; training.py: the run; retrieval_metrics.py: recall@k, MRR@k
    demo_pairs.py                 docstring summary -> body pairs from the embedded corpus
Pooling modes live in bertjax.models.pooling (task heads share them).
"""

from __future__ import annotations

from bertjax.embeddings.config import DenseConfig, PoolingConfig
from bertjax.embeddings.embed import Embedder
from bertjax.embeddings.encoder import SentenceEncoder
from bertjax.embeddings.model import EncoderForEmbedding
from bertjax.embeddings.sentence_transformers_dir import load_sentence_encoder, save_sentence_encoder
from bertjax.embeddings.similarity import SIMILARITY_FUNCTIONS

__all__ = ["DenseConfig", "Embedder", "PoolingConfig", "EncoderForEmbedding", "SentenceEncoder", "load_sentence_encoder",
           "save_sentence_encoder", "SIMILARITY_FUNCTIONS"]
