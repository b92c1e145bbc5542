"""Token classification (named entities, part of speech): a sentence given as words, one tag per word.

Each word's tag sits on its first sub-token (the others are ignored by the loss, IGNORE); predictions are read
back at the same positions, so they are word-aligned. A word the model never saw (cut by data.max_length, or one
with no token at all, such as whitespace) has no position: `predict` gives it tag and score null rather than a tag
the model did not choose, and the metrics count it as outside any entity. Metrics are entity-level as seqeval's
(BIO / IOB2).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bertjax.finetune import metrics
from bertjax.finetune.encoding import (encode_words, stack, token_predictions_to_words, word_labels_to_tokens)
from bertjax.finetune.readers import require_columns, text_list
from bertjax.finetune.tasks.base import Encoded, Labels, Task, cross_entropy, fit_names, label_ids, softmax


def was_cut(tokenizer, words: list[str], word_of_token: np.ndarray) -> bool:
    """Whether `encode_words` cut the sentence: a word after the last one with a position has tokens (words
    without any, such as whitespace, are never given a position, cut or not)."""
    placed = word_of_token[word_of_token >= 0]
    last = int(placed.max()) if len(placed) else -1
    if last == len(words) - 1:
        return False
    return any(len(pieces) for pieces in tokenizer.encode_batch([" " + word for word in words[last + 1:]]))


class TokenClassification(Task):
    name = "token-classification"
    head = "token_classification"
    main_metric = "f1"
    prediction_unit = "tokens"  # packed prediction: tags per token, cut back per sentence
    truncation_effect = "their words past the cut were never seen by the model and have tag and score null"
    defaults = {"train": {"learning_rate": 5e-5, "batch_size": 32, "epochs": 3}, "data": {"max_length": 128}}

    def label_settings(self, labels: Labels) -> dict:
        return {"num_labels": labels.num_labels, "labels": labels.names}

    def _words_and_tags(self, rows, source, with_targets):
        columns = {"data.tokens_column": self.data.tokens_column}
        if with_targets:
            columns["data.tags_column"] = self.data.tags_column
        require_columns(rows, source, columns)
        out = []
        for i, row in enumerate(rows):
            words = text_list(row[self.data.tokens_column], f"{source}, row {i + 1}, tokens")
            tags = None
            if with_targets:
                tags = text_list(row[self.data.tags_column], f"{source}, row {i + 1}, tags")
                if len(tags) != len(words):
                    raise ValueError(f"{source}, row {i + 1}: {len(words)} words but {len(tags)} tags")
            out.append((words, tags))
        return out

    def fit_labels(self, rows, source, known):
        tags = [t for _, sentence in self._words_and_tags(rows, source, True) for t in sentence]
        names = fit_names(tags, known)
        if "O" in names and not known:  # the outside tag first, as CoNLL label lists have it
            names = ("O",) + tuple(n for n in names if n != "O")
        return Labels(names=names)

    def encode(self, tokenizer, rows, labels, source, *, with_targets, training=False):
        sentences = self._words_and_tags(rows, source, with_targets)
        encoded, word_maps, examples, truncated = [], [], [], 0
        for i, (words, tags) in enumerate(sentences):
            row, word_of_token = encode_words(tokenizer, words, self.data.max_length, self.data.truncation,
                                              f"{source}, row {i + 1}")
            truncated += was_cut(tokenizer, words, word_of_token)
            if with_targets:
                ids = label_ids(tags, labels.names, f"{source}, row {i + 1}", self.data.tags_column, unit="word")
                row["labels"] = word_labels_to_tokens(word_of_token, ids)
            encoded.append(row)
            word_maps.append(word_of_token)
            examples.append((words, tags))
        arrays = stack(encoded)
        arrays["word_of_token"] = np.stack(word_maps)  # host-side only (not a model input)
        return Encoded(arrays, examples, truncated=truncated)

    def loss_sums(self, output, batch):
        labels = batch["labels"]
        losses = cross_entropy(output.logits, labels)
        counted = (labels >= 0) * batch["weight"][:, None]
        return jnp.sum(losses * counted), jnp.sum(counted)

    @classmethod
    def host_outputs(cls, output):
        return {"logits": output.logits.astype(jnp.float32)}

    def _word_tags(self, outputs, encoded, labels):
        """Predicted (tag, score) per word of each sentence; (None, None) for a word without a position, which the
        model never saw."""
        out = []
        for logits, word_of_token, (words, _) in zip(outputs["logits"], encoded.arrays["word_of_token"],
                                                     encoded.examples):
            probabilities = softmax(logits)
            ids = token_predictions_to_words(word_of_token, probabilities.argmax(-1), len(words), -1)
            scores = token_predictions_to_words(word_of_token, probabilities.max(-1), len(words), -1)
            out.append([(labels.names[i], float(s)) if i >= 0 else (None, None) for i, s in zip(ids, scores)])
        return out

    def metrics(self, outputs, encoded, labels):
        # An unseen word is no entity: a gold entity there counts as missed, never as a made-up tag's match.
        predicted = [["O" if tag is None else tag for tag, _ in sentence]
                     for sentence in self._word_tags(outputs, encoded, labels)]
        gold = [tags for _, tags in encoded.examples]
        return metrics.entity_scores(predicted, gold)

    def predictions(self, outputs, encoded, labels):
        records = []
        for (words, _), sentence in zip(encoded.examples, self._word_tags(outputs, encoded, labels)):
            records.append({"tokens": words, "tags": [tag for tag, _ in sentence],
                            "scores": [score for _, score in sentence]})
        return records
