"""XLNet (Yang et al. 2019): two-stream attention with relative positions, as transformers' XLNetModel.

Its own modules because the math differs: a content stream h (every token sees its context and itself) and, when
`target_mapping` is given, a query stream g (a learned mask embedding per prediction slot that sees the content of
its context but never its own token); scores add a term over sinusoidal encodings of the relative distance and a
term for "same segment or not". Everything else is the family's: the word embedding (bertjax.models.embeddings),
Linear, norm and Mlp (bertjax.models.common, bertjax.models.mlp), the tied LM head and the task heads.

Importing this package registers attention_kind "two_stream" in ATTENTION_MODULES and its stack in STACKS.
"""

from __future__ import annotations

from bertjax.models.attention import ATTENTION_MODULES
from bertjax.models.model import STACKS
from bertjax.models.xlnet.attention import RelativeAttention
from bertjax.models.xlnet.stack import XLNetStack

ATTENTION_MODULES["two_stream"] = RelativeAttention
STACKS["two_stream"] = XLNetStack

__all__ = ["RelativeAttention", "XLNetStack"]
