"""One way the CPU benchmarks time a call: the median over repeated calls after a warm-up."""

from __future__ import annotations

import time

import numpy as np


def median_call(fn, repeats: int, min_seconds: float = 3.0) -> tuple[float, float]:
    """Median (wall seconds, process CPU seconds) per call over at least `repeats` calls and `min_seconds`, after a
    warm-up call (JAX compiles there). CPU seconds (all threads of this process) are the fairer comparison when other
    jobs load the machine: a thread waiting for a core costs wall time but no CPU time."""
    fn()
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < repeats or time.perf_counter() - start < min_seconds:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return float(np.median(walls)), float(np.median(cpus))
