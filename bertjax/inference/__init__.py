"""Jitted inference over raw texts: shape buckets, packing, token-budget batches, a data-parallel mesh.

See bertjax/inference/texts.py (`TextInference`) for the entry point and runner.py for the row-function contract.
"""

from __future__ import annotations

from bertjax.inference.buckets import BucketConfig, BucketPlan, plan_buckets
from bertjax.inference.pipeline import Outputs, SequenceFormat, supports_packing, to_sequences
from bertjax.inference.rows import encoder_row_fn
from bertjax.inference.runner import Runner, data_mesh
from bertjax.inference.texts import (TextInference, check_tokenizer_fits, model_max_length, text_list,
                                    with_compute_dtype)

__all__ = ["BucketConfig", "BucketPlan", "Outputs", "Runner", "SequenceFormat", "TextInference",
           "check_tokenizer_fits", "data_mesh", "encoder_row_fn", "model_max_length", "plan_buckets",
           "supports_packing", "text_list", "to_sequences", "with_compute_dtype"]
