"""Continue a run's data on another number of processes (a pod preempted on 64 hosts, resumed on 32).

Each process saves its own position: {"window", "row"} in its plan (bertjax.data.windows.WindowPlan), relative
to the plan's origin (epoch, position). Process p of N reads positions p, p + N, ... of every epoch's global order,
and that order depends only on the seed and the epoch, so the N saved positions say exactly which documents were
read, whatever N was:

- the frontier of process p is the first document it has not finished (the first of its current window: a window
  read in part is read again in full);
- every position before the smallest frontier (in the earliest epoch any process is in) was read by some process,
  so the new processes start there: the new origin, shared by all of them, each reading its 1/M stride of the rest
  of that epoch, then whole epochs as usual;
- nothing is skipped; the documents some process had already read (in part) after that point are read again.
  Their count is `ReshardReport.documents_repeated`, logged as a warning and a metric.

With the same number of processes nothing here runs: each process restores its own position, bit for bit.
"""

from __future__ import annotations

import dataclasses

from bertjax.data.windows import WindowPlan


@dataclasses.dataclass(frozen=True)
class ReshardReport:
    from_processes: int
    to_processes: int
    epoch: int  # the new origin: every process restarts at this epoch ...
    position: int  # ... and position of the epoch's order
    documents_repeated: int  # documents read (at least in part) before, read again from the new origin

    def message(self) -> str:
        return (f"data position saved by {self.from_processes} processes, resumed on {self.to_processes}: the "
                f"new sharding restarts every process at epoch {self.epoch}, position {self.position}; "
                f"{self.documents_repeated} documents already read (in part) are read again, none is skipped")

    def metrics(self) -> dict[str, float]:
        return {"data_reshard_from_processes": float(self.from_processes),
                "data_reshard_documents_repeated": float(self.documents_repeated)}


def origin_of(state: dict) -> tuple[int, int]:
    epoch, position = state.get("origin", (0, 0))
    return int(epoch), int(position)


def _frontier(plan: WindowPlan, window: int) -> tuple[int, int]:
    """(epoch, position) of the first document of `window`: where this process's unread documents begin."""
    epoch, positions = plan.positions(window)
    return (epoch, int(positions[0])) if len(positions) else (epoch + 1, 0)


def _read_again(plan: WindowPlan, window: int, row: int, origin: tuple[int, int]) -> int:
    """Documents this process read (at least in part) at or after `origin` (those read again from it)."""
    count, last = 0, window if row > 0 else window - 1
    for j in range(last, -1, -1):
        epoch, positions = plan.positions(j)
        after = len(positions) if epoch > origin[0] else int((positions >= origin[1]).sum()) if epoch == origin[0] \
            else 0
        if after == 0:
            break  # windows only go further back from here
        count += after
    return count


def reshard(saved: list[dict], plan_of, to_processes: int) -> ReshardReport:
    """Where `to_processes` new processes continue (the report's epoch and position), from every old process's
    saved feed state.

    `saved[p]` is process p's {"iterator": {"window", "row", ...}, "origin": [epoch, position]};
    `plan_of(process_index, process_count, origin)` builds that process's WindowPlan.
    """
    count = len(saved)
    plans = [plan_of(p, count, origin_of(state)) for p, state in enumerate(saved)]
    frontiers = [_frontier(plan, int(state["iterator"]["window"])) for plan, state in zip(plans, saved)]
    epoch = min(e for e, _ in frontiers)
    origin = (epoch, min(g for e, g in frontiers if e == epoch))
    repeated = sum(_read_again(plan, int(state["iterator"]["window"]), int(state["iterator"]["row"]), origin)
                   for plan, state in zip(plans, saved))
    return ReshardReport(from_processes=count, to_processes=to_processes, epoch=origin[0], position=origin[1],
                         documents_repeated=repeated)
