"""Counters of what the pipeline read, skipped, split, packed and masked: a report, never a silent loss."""

from __future__ import annotations

import dataclasses

from bertjax.data.sources import SourceStats
from bertjax.data.windows import WINDOW_COUNTERS


@dataclasses.dataclass
class PipelineStats:
    """Source indexing results plus the sums of the counters of every window the iterator has consumed
    (since it was created or restored)."""

    source: SourceStats
    windows: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(WINDOW_COUNTERS, 0))

    def add_window(self, counts: dict[str, int]) -> None:
        self.windows += 1
        for key, value in counts.items():
            self.counts[key] += int(value)

    @property
    def packing_efficiency(self) -> float:
        """Fraction of row slots holding a real token ([CLS]/[SEP] count as real; padding does not)."""
        slots = self.counts["row_slots"]
        return self.counts["real_tokens"] / slots if slots else 0.0

    @property
    def masking_rate(self) -> float:
        candidates = self.counts["candidates"]
        return self.counts["predictions"] / candidates if candidates else 0.0

    def to_dict(self) -> dict:
        return {"source": self.source.to_dict(), "windows": self.windows, **self.counts,
                "packing_efficiency": self.packing_efficiency, "masking_rate": self.masking_rate}

    def report(self) -> str:
        c = self.counts
        return (f"source: {self.source.report()}. Pipeline: {self.windows} windows, {c['documents']} documents "
                f"({c['empty_after_tokenization']} empty after tokenization, {c['documents_split']} split over "
                f"rows), {c['document_tokens']} tokens -> {c['rows']} rows, packing efficiency "
                f"{self.packing_efficiency:.4f}, {c['dropped_tokens']} tokens dropped, masking rate "
                f"{self.masking_rate:.4f}")
