"""How fast the host runs plain Python right now.

The development host has slow spells that are not our code: in one hour the same
in-memory lease drain ran between 63k and 127k cycles/s. They are per virtual CPU:
pinned to one vCPU this reference workload took 41 ms while on the other it took 22,
minutes later the other way round, and the guest kernel reports no steal time to
tell. So the runner times this fixed workload on each CPU the process may use, just
before and just after each scenario, and writes the medians on every row the scenario
produced (``host_pace_ms``): a figure measured in a slow spell carries the evidence
itself, and two result files can be compared knowing how fast their host was. The workload is the interpreter-bound mix
the lease cycle and the wire codecs spend their time on: calls, attribute reads and
writes on slotted objects, small-object creation, dict and list traffic.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

WORKLOAD = (
    "100,000 iterations over a fixed set of 256 slotted objects: two dict lookups, an attribute "
    "write and read, a 2-tuple appended to a list, one method call; median of 7 timings, GC off"
)
SAMPLES = 7
ITERATIONS = 100_000


class _Item:
    __slots__ = ("key", "value")

    def __init__(self, key: str, value: int) -> None:
        self.key = key
        self.value = value

    def weight(self, scale: int) -> int:
        return self.value * scale


def _workload(iterations: int) -> int:
    # A fixed working set: no allocation grows with ``iterations``, so the timing reflects the
    # interpreter's speed, not the allocator's page faults.
    items = [_Item(f"k{i}", i) for i in range(256)]
    table = {item.key: item for item in items}
    keys = [item.key for item in items]
    stack: list[tuple[int, _Item]] = []
    total = 0
    for i in range(iterations):
        key = keys[i & 255]
        item = table[key]
        item.value = i
        stack.append((i, item))
        if len(stack) > 64:
            stack.clear()
        found = table.get(key)
        if found is not None:
            total += found.weight(3)
    return total


def reference_ms(samples: int = SAMPLES, iterations: int = ITERATIONS) -> float:
    """Median wall time of the reference workload, in milliseconds."""
    timings = []
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        _workload(iterations)  # warm-up, discarded: the first pass also grows the allocator's arenas
        for _ in range(samples):
            start = time.perf_counter()
            _workload(iterations)
            timings.append((time.perf_counter() - start) * 1000.0)
    finally:
        if was_enabled:
            gc.enable()
    return round(statistics.median(timings), 3)


def pace_by_cpu() -> dict[str, float]:
    """``reference_ms`` pinned to each CPU this process may run on, in turn (the process's
    affinity is restored afterwards); one unpinned figure, keyed ``"any"``, where the
    platform cannot pin."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    setaffinity = getattr(os, "sched_setaffinity", None)
    if getaffinity is None or setaffinity is None:
        return {"any": reference_ms()}
    allowed = getaffinity(0)
    out: dict[str, float] = {}
    try:
        for cpu in sorted(allowed):
            setaffinity(0, {cpu})
            out[f"cpu{cpu}"] = reference_ms()
    finally:
        setaffinity(0, allowed)
    return out


@contextmanager
def pinned_to_quietest_cpu() -> Iterator[tuple[str, float]]:
    """Pin this process to the CPU on which the reference workload runs fastest right
    now, and yield ``(cpu label, its pace in ms)``; the affinity is restored on exit.

    A single-threaded, interpreter-bound measurement pinned this way runs at the speed of
    the host's quieter vCPU instead of wherever the scheduler left it (the kernel cannot
    see the slow spells, so it never moves a thread away from one). Where the platform
    cannot pin, nothing is pinned and the label is ``"any"``."""
    paces = pace_by_cpu()
    label = min(paces, key=paces.__getitem__)
    setaffinity = getattr(os, "sched_setaffinity", None)
    if label == "any" or setaffinity is None:
        yield label, paces[label]
        return
    allowed = os.sched_getaffinity(0)
    setaffinity(0, {int(label.removeprefix("cpu"))})
    try:
        yield label, paces[label]
    finally:
        setaffinity(0, allowed)
