"""The planner's working record of one candidate strategy, before it becomes a
``CandidateVerdict`` (and, for the winner, a ``StrategyPlan``).

Plain slotted dataclasses (cheap to build and read on the planner's hot path): the menus
fill them, ranking orders them, minting converts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Order of statuses in the rendered candidate list.
STATUS_ORDER = ("selected", "feasible", "rejected_policy", "rejected_dominated", "infeasible")

# Strategy families of the CPU device class: one process, and gloo data parallel on one host.
CPU_FAMILIES = ("cpu", "cpu_ddp")

# How a candidate without a time says so; in a report where another candidate has a time, the
# same reason reads ``time unknown: ...`` so the report never claims there is no estimate at all.
NO_TIME = "no time estimate"
TIME_UNKNOWN = "time unknown"
# The end of a report note saying a request field's absence leaves no time; once a measurement
# gives a time the note says that only measured figures have one.
NO_TIME_NOTE = "no time or cost estimates"
MEASURED_TIME_NOTE = "no static time or cost estimates; only the measured figures have one"


@dataclass(slots=True, init=False)
class Memory:
    """Per-GPU memory in GiB (the fields of ``MemoryBreakdown``); totals are computed once."""

    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    transient_gb: float
    overhead_gb: float
    cpu_offload_gb: float
    tensors_gb: float
    total_gb: float

    # Hand-written rather than __post_init__: one call per Memory on the planner's hot path.
    def __init__(
        self,
        weights_gb: float = 0.0,
        gradients_gb: float = 0.0,
        optimizer_gb: float = 0.0,
        activations_gb: float = 0.0,
        transient_gb: float = 0.0,
        overhead_gb: float = 0.0,
        cpu_offload_gb: float = 0.0,
    ) -> None:
        self.weights_gb = weights_gb
        self.gradients_gb = gradients_gb
        self.optimizer_gb = optimizer_gb
        self.activations_gb = activations_gb
        self.transient_gb = transient_gb
        self.overhead_gb = overhead_gb
        self.cpu_offload_gb = cpu_offload_gb
        self.tensors_gb = tensors = weights_gb + gradients_gb + optimizer_gb + activations_gb + transient_gb
        self.total_gb = tensors + overhead_gb


@dataclass(slots=True)
class Knobs:
    """Training knobs a plan carries."""

    precision: str | None = None
    quantization: str | None = None
    peft: str | None = None
    micro_batch_per_gpu: int | None = None
    grad_accum: int | None = None
    activation_checkpointing: bool | None = None
    offload: str = "none"


@dataclass(slots=True)
class Miss:
    """How far a rejected candidate is from valid (ratio ≥ 1; smaller = nearer) and what would fix it."""

    ratio: float
    fix: str
    reason: str = ""  # the rejecting reason, filled by Candidate.reject


@dataclass(slots=True)
class Candidate:
    name: str
    family: str
    workers: int
    launcher: str
    workload_mode: str
    gpus_per_worker: int = 0
    colocated: bool = True
    status: str = "feasible"
    memory: Memory | None = None
    vram_gb: float | None = None
    time_min: float | None = None
    time_note: str = ""
    cost_usd: float | None = None
    cost_note: str = ""
    efficiency: float | None = None
    profiling_required: bool = False
    knobs: Knobs = field(default_factory=Knobs)
    libraries: tuple[tuple[str, str, str], ...] = ()
    reasons: list[str] = field(default_factory=list)
    miss: Miss | None = None
    # Unrounded figures: ``time_min``/``cost_usd`` are what the report shows (2 decimals), these are
    # what the deadline, budget and ranking compare (None: the shown figure is exact).
    time_exact: float | None = None
    cost_exact: float | None = None
    # Where each figure came from: static (the cited model), profiled or ledger (measured).
    memory_basis: str = "static"
    time_basis: str = "static"
    cost_basis: str = "static"
    # Why the candidate has no time (its ``no time estimate`` reason), None once it has one.
    no_time_why: str | None = None

    @property
    def on_cpu(self) -> bool:
        return self.family in CPU_FAMILIES

    def no_time(self, why: str) -> None:
        """Record that there is no time estimate, and why, as one of the reasons."""
        self.no_time_why = why
        self.reasons.append(f"{NO_TIME}: {why}")

    def set_time(self, minutes: float, arithmetic: str, exact: float | None = None,
                 basis: str = "static") -> None:
        """The time (shown minutes, its arithmetic, exact minutes); a ``no time estimate`` reason goes."""
        if self.no_time_why is not None:
            self.reasons.remove(f"{NO_TIME}: {self.no_time_why}")
            self.no_time_why = None
        self.time_min, self.time_note, self.time_exact, self.time_basis = minutes, arithmetic, exact, basis
        self.reasons.append(arithmetic)

    def call_time_unknown(self) -> None:
        """Reword the ``no time estimate`` reason as ``time unknown`` (another candidate has a time)."""
        if self.no_time_why is not None:
            index = self.reasons.index(f"{NO_TIME}: {self.no_time_why}")
            self.reasons[index] = f"{TIME_UNKNOWN}: {self.no_time_why}"

    def set_cost(self, usd: float, arithmetic: str, exact: float | None = None) -> None:
        self.cost_usd, self.cost_note, self.cost_exact = usd, arithmetic, exact
        self.reasons.append(arithmetic)

    @property
    def exact_time(self) -> float | None:
        return self.time_min if self.time_exact is None else self.time_exact

    @property
    def exact_cost(self) -> float | None:
        return self.cost_usd if self.cost_exact is None else self.cost_exact

    @property
    def feasible(self) -> bool:
        return self.status in ("feasible", "selected")

    def reject(self, status: str, reason: str, miss: Miss | None = None) -> None:
        """Mark the candidate ``infeasible`` / ``rejected_*``; infeasibility outranks a policy rejection.

        The recorded miss is the binding one: an infeasibility over a policy miss, else the larger ratio.
        """
        self.reasons.append(reason)
        was_infeasible = self.status == "infeasible"
        if not was_infeasible:
            self.status = status
        if miss is None:
            return
        miss.reason = reason
        if self.miss is None:
            self.miss = miss
        elif status == "infeasible" and not was_infeasible:
            self.miss = miss
        elif (status == "infeasible") == was_infeasible and miss.ratio > self.miss.ratio:
            self.miss = miss
