"""Every Hugging Face family bertjax reads and writes, by EncoderConfig.family. Adding a family: one module defining
`FAMILY = HfFamily(...)` and one line here."""

from __future__ import annotations

from bertjax.config import TaskConfig
from bertjax.hf import albert, bert, deberta, distilbert, electra, eurobert, modernbert, mosaicbert, roberta, xlnet
from bertjax.hf import longformer
from bertjax.hf.family import HfFamily

FAMILIES: dict[str, HfFamily] = {family.model_type: family for family in (
    bert.FAMILY,
    roberta.FAMILY,
    modernbert.FAMILY,
    albert.FAMILY,
    distilbert.FAMILY,
    electra.FAMILY,
    eurobert.FAMILY,
    xlnet.FAMILY,
    deberta.FAMILY_V1,
    deberta.FAMILY_V2,
    longformer.FAMILY,
    mosaicbert.FAMILY,
)}

# Families whose config.json says another family's model_type and names remote code: asked first, by their `claims`.
REMOTE_CODE_FAMILIES = tuple(family for family in FAMILIES.values() if family.claims is not None)

# transformers class name (config.architectures[0]) -> (model_type, bertjax head). Remote-code families reuse the
# names of the family they are written as (MosaicML's BertForMaskedLM), so they are not listed here.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    name: (family.model_type, head) for family in FAMILIES.values() if family.claims is None
    for name, head in family.heads.items()}

# Classes of these families that bertjax does not model, and why. `backbone`: the encoder inside is bidirectional,
# so `from_pretrained(path, head=...)` takes it and starts the asked-for head; the others were trained as decoders.
# `instead`: the head to suggest.
UNSUPPORTED: dict[str, tuple[str, bool] | tuple[str, bool, str]] = {
    "BertLMHeadModel": ("a causal (left-to-right) language model", False),
    "RobertaForCausalLM": ("a causal (left-to-right) language model", False),
    "ElectraForCausalLM": ("a causal (left-to-right) language model", False),
    "XLNetForQuestionAnswering": ("a beam-search span head (start/end top-k and an answerability classifier)",
                                  True, "head='question_answering': XLNetForQuestionAnsweringSimple's span head"),
}


def family_named(model_type: str, source: str = "config.json") -> HfFamily:
    """The family for a model_type; `source` names where it came from (config.json, or EncoderConfig.family)."""
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ValueError(f"{source}: unknown model_type {model_type!r}; Hugging Face families bertjax reads and "
                         f"writes: {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def architecture(values: dict, head: str | None = None) -> tuple[HfFamily, str]:
    """(family, bertjax head) of a config.json, from `architectures[0]` checked against `model_type`.

    `head`: the head the caller will build instead. A class bertjax does not model but whose encoder is
    bidirectional is then accepted, and its name returned as the head the file holds.
    Older files lack one of the two, as transformers accepts: a missing `model_type` is the named class's family; a
    missing `architectures` (DeBERTa's own releases have none) gives "encoder", the family's bare model, which
    transformers' AutoModel builds from such a file (from_pretrained then looks for an MLM head in the tensors).
    """
    family = next((f for f in REMOTE_CODE_FAMILIES if f.claims(values)), None)
    model_type = values.get("model_type")
    architectures = values.get("architectures")
    named = architectures[0] if isinstance(architectures, list) and architectures else None
    if family is None:
        if model_type == "mosaicbert":
            raise ValueError("config.json: model_type 'mosaicbert' is bertjax's name for MosaicBERT; MosaicML's "
                             "checkpoints say model_type 'bert' and name bert_layers.py in auto_map")
        if model_type is None and isinstance(named, str) and named in ARCHITECTURES:
            model_type = ARCHITECTURES[named][0]
        if model_type is None:
            raise ValueError(f"config.json: no 'model_type', and architectures[0] ({named!r}) is no class bertjax "
                             f"reads; Hugging Face families bertjax reads and writes: {sorted(FAMILIES)}")
        family = family_named(model_type)
    if architectures is None:
        return family, "encoder"
    if not isinstance(named, str):
        raise ValueError("config.json: 'architectures' must name the model class, e.g. "
                         f"[\"{next(iter(family.heads))}\"]")
    name = architectures[0]
    if name in family.heads:
        return family, family.heads[name]
    if name in ARCHITECTURES and family.claims is None:
        raise ValueError(f"config.json: architecture {name!r} is a {ARCHITECTURES[name][0]} model but model_type "
                         f"is {model_type!r}")
    if name in UNSUPPORTED:
        why, backbone, *instead = UNSUPPORTED[name]
        if backbone and head is not None:
            return family, name
        suggested = "".join(f", or {s}" for s in instead)
        hint = (f" To start another head on its encoder, pass head= (e.g. head='encoder'{suggested})."
                if backbone else "")
        raise ValueError(f"config.json: {name} is {why}, which bertjax does not model.{hint} {family.model_type} "
                         f"classes bertjax reads: {sorted(family.heads)}")
    raise ValueError(f"config.json: unsupported architecture {name!r}; {family.model_type} classes bertjax reads: "
                     f"{sorted(family.heads)}")


def default_task(family: str) -> TaskConfig:
    """The task settings a family's transformers heads take when config.json says none (the pooling: EuroBERT's
    "late", XLNet's last token); TaskConfig's own for families bertjax has no Hugging Face heads for."""
    heads = FAMILIES[family].task_heads if family in FAMILIES else None
    return TaskConfig() if heads is None else TaskConfig(classifier_pooling=heads.pooling_default)
