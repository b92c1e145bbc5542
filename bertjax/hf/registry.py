"""Every Hugging Face family bertjax reads and writes, by model_type. Adding a family: one module defining
`FAMILY = HfFamily(...)` and one line here."""

from __future__ import annotations

from bertjax.hf import albert, bert, deberta, distilbert, electra, eurobert, modernbert, roberta, xlnet
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
)}

# Families bertjax models that have no transformers class, so no checkpoint format to read or write: family -> why.
WITHOUT_HF_CLASS: dict[str, str] = {
    "mosaicbert": "MosaicBERT has no transformers class (MosaicML's checkpoints run through remote code); save the "
                  "model as a bertjax model directory instead",
}

# transformers class name (config.architectures[0]) -> (model_type, bertjax head).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    name: (family.model_type, head) for family in FAMILIES.values() for name, head in family.heads.items()}


def family_named(model_type: str, source: str = "config.json") -> HfFamily:
    """The family for a model_type; `source` names where it came from (config.json, or EncoderConfig.family)."""
    if model_type in WITHOUT_HF_CLASS:
        raise ValueError(f"{source}: {model_type!r}: {WITHOUT_HF_CLASS[model_type]}")
    if model_type not in FAMILIES:
        raise ValueError(f"{source}: unknown model_type {model_type!r}; Hugging Face families bertjax reads and "
                         f"writes: {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def architecture(values: dict) -> tuple[HfFamily, str]:
    """(family, bertjax head) of a config.json, from `architectures[0]` checked against `model_type`."""
    model_type = values.get("model_type")
    family = family_named(model_type)
    architectures = values.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise ValueError("config.json: 'architectures' must name the model class, e.g. [\"BertForMaskedLM\"]")
    name = architectures[0]
    if name not in ARCHITECTURES:
        raise ValueError(f"config.json: unsupported architecture {name!r}; supported: {sorted(ARCHITECTURES)}")
    owner, head = ARCHITECTURES[name]
    if owner != model_type:
        raise ValueError(f"config.json: architecture {name!r} is a {owner} model but model_type is {model_type!r}")
    return family, head
