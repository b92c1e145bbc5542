"""One window of documents -> finished training rows: the unit of work of the pipeline.

The documents of one process are cut, epoch by epoch, into windows of `window_documents` consecutive documents
(in that epoch's shuffled order). Window number j means (epoch, window in epoch) and is computed from j alone:
read -> tokenize -> lay out rows (pack / pad / sentence pairs) -> shuffle rows -> mask. So any window can be
built by any thread or worker process in any order, and a restored iterator rebuilds exactly the window it
stopped in. All randomness of a window comes from one seed sequence over (seed, split, process, epoch, window):
masks change every epoch (dynamic masking) yet are reproducible, whatever the number of workers.
"""

from __future__ import annotations

import dataclasses
import math

import grain
import numpy as np

from bertjax.data.masking import MaskingOptions, MaskingVocab, mask_rows
from bertjax.data.nsp import make_sentence_pairs
from bertjax.data.packing import PACKERS, SpecialTokens

_SPLIT_CODES = {"train": 0, "eval": 1, "all": 2}
_SHUFFLE_ROUNDS = 4
# Counters every window reports (summed by the batch iterator into PipelineStats).
WINDOW_COUNTERS = ("documents", "empty_after_tokenization", "documents_split", "document_tokens", "rows",
                   "row_slots", "real_tokens", "dropped_tokens", "candidates", "predictions", "nsp_positive")


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """Which documents window j holds, for one process.

    Position g of an epoch is the g-th document of that epoch's (shuffled) global order; process p of N reads
    positions p, p + N, p + 2N, ... A plan may start at an `origin` (epoch e, position G) instead of (0, 0): a run
    resumed on another number of processes continues from there (see bertjax.data.reshard). Its first epoch then
    holds only positions G, G + 1, ... (split over the new processes the same strided way); later epochs are whole.
    """

    num_documents: int
    window_documents: int
    process_index: int
    process_count: int
    shuffle: bool
    seed: int
    start_epoch: int = 0
    start_position: int = 0

    def __post_init__(self):
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index ({self.process_index}) must be in [0, process_count="
                             f"{self.process_count})")
        if not 0 <= self.start_position <= self.num_documents or self.start_epoch < 0:
            raise ValueError(f"plan origin (epoch {self.start_epoch}, position {self.start_position}) is outside "
                             f"the data ({self.num_documents} documents)")

    def _share(self, first_position: int) -> int:
        return len(range(first_position + self.process_index, self.num_documents, self.process_count))

    @property
    def documents_per_epoch(self) -> int:
        """This process's share of a whole epoch: positions p, p + N, p + 2N, ... of each epoch's global order."""
        return self._share(0)

    @property
    def windows_per_epoch(self) -> int:
        return math.ceil(self.documents_per_epoch / self.window_documents)

    @property
    def first_epoch_windows(self) -> int:
        """Windows of the plan's first epoch (all of them, unless the plan starts mid-epoch)."""
        return math.ceil(self._share(self.start_position) / self.window_documents)

    def total_windows(self, epochs: int) -> int:
        """Windows of a plan that ends after `epochs` epochs of the run (counted from epoch 0)."""
        return self.first_epoch_windows + self.windows_per_epoch * max(epochs - self.start_epoch - 1, 0)

    def locate(self, window: int) -> tuple[int, int]:
        """Window number -> (epoch, window within the epoch's windows of this plan)."""
        if window < self.first_epoch_windows:
            return self.start_epoch, window
        epochs, within = divmod(window - self.first_epoch_windows, max(self.windows_per_epoch, 1))
        return self.start_epoch + 1 + epochs, within

    def positions(self, window: int) -> tuple[int, np.ndarray]:
        """(epoch, global positions in that epoch's order) of the documents of window `window`."""
        epoch, within = self.locate(window)
        first = self.start_position if epoch == self.start_epoch else 0
        first_local = within * self.window_documents
        local = np.arange(first_local, min(first_local + self.window_documents, self._share(first)))
        return epoch, first + self.process_index + local * self.process_count

    def document_indices(self, window: int) -> np.ndarray:
        epoch, positions = self.positions(window)
        if not self.shuffle:
            return positions
        # Every process shuffles with the same epoch seed, so their strided shares stay disjoint (whatever their
        # number: the order of an epoch depends on the seed and the epoch only).
        epoch_seed = int(np.random.SeedSequence([self.seed, epoch, 0x5EED]).generate_state(1)[0])
        last = self.num_documents - 1
        return np.array([grain.experimental.index_shuffle(int(g), max_index=last, seed=epoch_seed,
                                                          rounds=_SHUFFLE_ROUNDS) for g in positions], np.int64)


class WindowBuilder:
    """Picklable: window number -> dict of row arrays (leading dimension = rows of the window) + counters."""

    def __init__(self, source, tokenizer, plan: WindowPlan, *, seq_len: int, packing: str, sentence_objective: str,
                 short_seq_prob: float, masking: MaskingOptions, split: str):
        self.source = source
        # Prepared data is already tokenized; raw text is tokenized here, inside the (parallel) window work.
        self.tokenizer = None if source.tokenized else tokenizer
        self.plan = plan
        self.seq_len = seq_len
        self.packing = packing
        self.sentence_objective = sentence_objective
        self.short_seq_prob = short_seq_prob
        self.masking = masking
        self.split = split
        self.specials = SpecialTokens(tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)
        self.vocab = MaskingVocab.from_tokenizer(tokenizer)

    def rngs(self, window: int) -> list[np.random.Generator]:
        epoch, within = self.plan.locate(window)
        sequence = np.random.SeedSequence([self.plan.seed, _SPLIT_CODES[self.split], self.plan.process_index,
                                           self.plan.process_count, epoch, within])
        return [np.random.default_rng(child) for child in sequence.spawn(3)]

    def __call__(self, window: int) -> dict:
        window = int(window)
        layout_rng, order_rng, mask_rng = self.rngs(window)
        counts = dict.fromkeys(WINDOW_COUNTERS, 0)
        documents = self.source.get_many(self.plan.document_indices(window))
        if self.tokenizer is not None:
            documents = self.tokenizer.encode_batch(documents)
        counts["documents"] = len(documents)
        tokens = [doc for doc in documents if len(doc)]
        counts["empty_after_tokenization"] = len(documents) - len(tokens)
        counts["document_tokens"] = sum(len(doc) for doc in tokens)

        arrays = {}
        if self.sentence_objective == "none":
            rows, counts["documents_split"] = PACKERS[self.packing](tokens, self.seq_len, self.specials)
        else:
            rows, labels, counts["dropped_tokens"] = make_sentence_pairs(
                tokens, self.seq_len, self.sentence_objective, self.short_seq_prob, self.specials, layout_rng)
            arrays["nsp_labels"] = labels
        # Packing emits rows longest-first; a permutation keeps batches from holding only similar rows.
        order = order_rng.permutation(rows.num_rows)
        rows = rows.take(order)
        if "nsp_labels" in arrays:
            arrays["nsp_labels"] = arrays["nsp_labels"][order]
            counts["nsp_positive"] = int((arrays["nsp_labels"] == 0).sum())
        masked = mask_rows(rows.input_ids, rows.segment_ids, self.vocab, self.masking, mask_rng)
        arrays.update(masked, segment_ids=rows.segment_ids, positions=rows.positions,
                      token_type_ids=rows.token_type_ids)

        real = rows.segment_ids > 0
        counts["rows"] = rows.num_rows
        counts["row_slots"] = int(rows.segment_ids.size)
        counts["real_tokens"] = int(real.sum())
        counts["candidates"] = int((real & ~self.vocab.is_special[rows.input_ids]).sum())
        counts["predictions"] = int(masked["masked_weights"].sum())
        return {"window": window, "rows": arrays, "counts": counts}
