"""Fine-tuning heads in Hugging Face terms, shared by every family: config keys, tensor names, refusals.

Each family module describes its heads with one `TaskHeads` value (class names, tensor names, its dropout and
pooling keys, the classifier layout its heads have); `HfFamily` applies it on import, export and key mapping, so
no family repeats the label handling. The math is bertjax.models.task_heads'; here only names differ:

    family      sequence / multiple choice: dense, [norm], out         token classification / QA: out
    BERT/ALBERT pooler.dense (ALBERT: pooler), classifier               classifier / qa_outputs
    RoBERTa     classifier.dense, classifier.out_proj (MC: pooler)     classifier / qa_outputs
    DistilBERT  pre_classifier, classifier                             classifier / qa_outputs
    ELECTRA     classifier.dense, classifier.out_proj (MC: summary)    classifier / qa_outputs
    EuroBERT    dense, classifier                                      classifier (no QA or MC class)
    ModernBERT  head.dense, head.norm, classifier (all four heads; TC and QA also run head.dense/norm)
    XLNet       sequence_summary.summary, logits_proj (last token)      classifier / qa_outputs
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bertjax.config import EncoderConfig, TaskConfig
from bertjax.hf.config_common import Refusals
from bertjax.hf.mapping import TensorRule, layer_norm, linear
from bertjax.models.task_models import TASK_HEADS

SEQUENCE_HEADS = ("sequence_classification", "multiple_choice")  # pooled; the rest are per token
HEAD_SCOPE = "classifier"  # every task head's parameters live under params["classifier"]


@dataclasses.dataclass(frozen=True)
class HeadKeys:
    """Tensor names (without .weight/.bias) of one head in one family."""

    out: str  # the last linear layer
    dense: str | None = None  # the pooled (or per-token, ModernBERT) transform's linear layer
    norm: str | None = None  # ModernBERT's head.norm


@dataclasses.dataclass(frozen=True)
class TaskHeads:
    """One family's fine-tuning heads."""

    base_prefix: str  # the backbone's prefix inside every head class ("bert.", "model.", ...)
    architectures: Mapping[str, str]  # transformers class name -> bertjax head
    keys: Mapping[str, HeadKeys]  # bertjax head -> tensor names
    # The classifier layout of the family's heads (EncoderConfig fields); None: the activation is
    # head_activation (ModernBERT's one `classifier_activation` key serves both heads).
    activation: str | None
    activation_from_config: bool = False  # the family reads it from config.json itself (DeBERTa's pooler_hidden_act)
    norm: bool = False
    token_transform: bool = False
    dense_bias: bool | None = True  # None: head_dense_bias as config.json says (ModernBERT's classifier_bias)
    dropout_key: str | None = "classifier_dropout"  # config.json key of the classifier dropout, if any
    # The rate its config class takes when config.json has no such key; None: the encoder's dropout (BERT's
    # classifier_dropout=None means hidden_dropout_prob). ALBERT's is 0.1, DistilBERT's 0.2, XLNet's 0.1.
    dropout_default: float | None = None
    # bertjax classifier_pooling -> config.json `classifier_pooling` value; empty: first token only, key not written.
    poolings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pooling_default: str = "cls"  # the config class's default, as a bertjax name
    pooling_key: str = "classifier_pooling"  # the config.json key naming the pooling (XLNet: summary_type)

    def layout(self, config: EncoderConfig) -> dict:
        activation = (config.classifier_activation if self.activation_from_config else
                      self.activation if self.activation is not None else config.head_activation)
        layout = {"classifier_activation": activation, "classifier_norm": self.norm,
                  "classifier_token_transform": self.token_transform}
        return layout if self.dense_bias is None else {**layout, "head_dense_bias": self.dense_bias}

    def configure(self, config: EncoderConfig, values: dict, head: str) -> EncoderConfig:
        """The family's classifier layout (every head: so a task head started from an encoder has it too), and for
        task heads the labels, problem type, dropout and pooling of config.json. Other heads keep a classifier
        dropout or pooling their config.json sets apart from the family's defaults (ModernBERT's MLM releases say
        "classifier_pooling": "mean"), so that a task head fine-tuned from them is the one transformers builds."""
        config = config.replace(**self.layout(config))
        if head in TASK_HEADS:
            return config.replace(task=self.read_task(values, config.dropout_rate))
        dropout, pooling = self.read_classifier(values, config.dropout_rate)
        if dropout is None and pooling == self.pooling_default:  # nothing the family's defaults do not say
            return config
        return config.replace(task=TaskConfig(classifier_dropout=dropout, classifier_pooling=pooling))

    def read_task(self, values: dict, dropout_rate: float) -> TaskConfig:
        """TaskConfig of config.json; a classifier dropout equal to the encoder's is stored as None (the same)."""
        id2label = values.get("id2label")
        if id2label is not None:
            if not isinstance(id2label, dict) or not id2label:
                raise ValueError(f"config.json: id2label must be a non-empty object, got {id2label!r}")
            try:
                ids = sorted(int(i) for i in id2label)
            except ValueError as error:
                raise ValueError(f"config.json: id2label keys must be integers, got {sorted(id2label)}") from error
            if ids != list(range(len(ids))):
                raise ValueError(f"config.json: id2label keys must be 0..{len(ids) - 1}, got {ids}")
            names = tuple(str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in ids)
            num_labels = len(names)
        else:
            num_labels = values.get("num_labels", 2)
            names = None
        labels = None if names is None or names == TaskConfig(num_labels=num_labels).label_names else names
        dropout, pooling = self.read_classifier(values, dropout_rate)
        return TaskConfig(num_labels=num_labels, labels=labels, problem_type=values.get("problem_type"),
                          classifier_dropout=dropout, classifier_pooling=pooling)

    def read_classifier(self, values: dict, dropout_rate: float) -> tuple[float | None, str]:
        """(classifier dropout, pooling) of config.json; a dropout equal to the encoder's is None (the same)."""
        pooling = self.pooling_default
        if self.poolings and values.get(self.pooling_key) is not None:
            by_hf_name = {hf: ours for ours, hf in self.poolings.items()}
            if values[self.pooling_key] not in by_hf_name:
                raise ValueError(f"config.json: {self.pooling_key}={values[self.pooling_key]!r} is not "
                                 f"supported; known: {sorted(by_hf_name)}")
            pooling = by_hf_name[values[self.pooling_key]]
        dropout = values.get(self.dropout_key) if self.dropout_key else None
        dropout = self.dropout_default if dropout is None else dropout
        return (None if dropout is None or float(dropout) == dropout_rate else float(dropout)), pooling

    def refuse(self, refuse: Refusals, config: EncoderConfig, head: str) -> None:
        """What a task head model must have to be written as this family's checkpoint."""
        refuse.need(**self.layout(config))
        task = config.task_or_default
        allowed = tuple(self.poolings) or (self.pooling_default,)
        refuse.check(config.classifier_pooling in allowed, f"task.classifier_pooling={config.classifier_pooling!r} "
                     f"(the family's heads pool with {list(allowed)})")
        if head == "question_answering":
            refuse.check(task.num_labels == 2, f"task.num_labels={task.num_labels} (question answering has 2)")

    def to_hf(self, config: EncoderConfig) -> dict:
        """config.json keys of the task settings (transformers' names)."""
        task = config.task_or_default
        return {"id2label": {str(i): name for i, name in task.id2label.items()}, "label2id": task.label2id,
                "problem_type": task.problem_type, **self.classifier_to_hf(config)}

    def classifier_to_hf(self, config: EncoderConfig) -> dict:
        """config.json keys of the classifier dropout and pooling, written for every head: a task head fine-tuned
        from the checkpoint takes them (and a missing dropout key would read as the config class's default)."""
        task = config.task_or_default
        values = {}
        if self.dropout_key:  # the rate in effect: ALBERT, DistilBERT and ModernBERT refuse null here
            values[self.dropout_key] = (config.dropout_rate if task.classifier_dropout is None
                                        else task.classifier_dropout)
        if config.classifier_pooling in self.poolings:  # (a task head's pooling was checked: `refuse`)
            values[self.pooling_key] = self.poolings[config.classifier_pooling]
        return values

    def rules(self, config: EncoderConfig, head: str) -> list[TensorRule]:
        """Tensor rules of the head (none for heads the family has no class for: import then initialises it)."""
        if head not in TASK_HEADS or head not in self.keys:
            return []
        keys, h = self.keys[head], config.hidden_size
        outputs = {"sequence_classification": config.task_or_default.num_labels, "token_classification":
                   config.task_or_default.num_labels, "question_answering": 2, "multiple_choice": 1}[head]
        rules: list[TensorRule] = []
        if head in SEQUENCE_HEADS or config.classifier_token_transform:
            rules += linear(keys.dense, (HEAD_SCOPE, "dense"), h, h, bias=config.head_dense_bias)
            if config.classifier_norm:
                rules += layer_norm(keys.norm, (HEAD_SCOPE, "norm"), h, config.norm_bias)
        rules += linear(keys.out, (HEAD_SCOPE, "out"), h, outputs, bias=True)
        return rules


def bert_like_keys(sequence: HeadKeys, multiple_choice: HeadKeys) -> dict[str, HeadKeys]:
    """BERT's head names, which RoBERTa, ALBERT, DistilBERT and ELECTRA share but for the pooled heads."""
    return {"sequence_classification": sequence, "token_classification": HeadKeys(out="classifier"),
            "question_answering": HeadKeys(out="qa_outputs"), "multiple_choice": multiple_choice}


def architectures(prefix: str, heads=TASK_HEADS) -> dict[str, str]:
    """{"BertForSequenceClassification": "sequence_classification", ...} for the given heads."""
    names = {"sequence_classification": "SequenceClassification", "token_classification": "TokenClassification",
             "question_answering": "QuestionAnswering", "multiple_choice": "MultipleChoice"}
    return {f"{prefix}For{names[head]}": head for head in heads}
