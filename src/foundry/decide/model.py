"""The shape of a decision. Pure data; no behaviour beyond formatting helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Answer", "Bill", "Decision", "Host", "Load", "Measured", "Rejected", "Warning"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One question asked, in order, and what the traits answered."""

    id: str  # stable key, e.g. "size", "bound", "isolation", "durable"
    axis: str  # "delivery" or "execution"
    question: str  # the question as a person reads it
    answer: str  # what the traits said ("not declared" when unknown)
    decided: bool  # True for the question that stopped the walk on its axis


@dataclass(frozen=True, slots=True)
class Bill:
    """A model's row of the bills table."""

    model: str
    choose_when: str
    why: str
    costs: str
    fails: str
    guarantees: str = ""  # which part of "exactly once, observed, nothing discarded" it keeps
    watch: tuple[str, ...] = ()  # metric names (foundry.observe.names) that show it failing
    simpler: str = ""  # the simpler thing to consider before paying this bill


@dataclass(frozen=True, slots=True)
class Host:
    """Facts about the interpreter and machine, passed in so ``decide`` stays pure.

    ``None`` means unknown: the engine then assumes CPython with the GIL and a
    typical 8-core machine, and says so in the notes. ``foundry.profile.current_host()``
    reads the real values (``os.cpu_count()``, ``sys._is_gil_enabled()``).
    """

    cores: int | None = None
    gil: bool | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """The offered load and what the chosen model serves, with the arithmetic shown.

    Little's law: units in flight ``L = λ × W`` (arrival ``rate`` × time per unit
    ``est``). For computing work each unit in flight holds a core, so ``L`` is also the
    cores it needs. ``concurrency`` is what the decision runs at once — pool workers,
    process workers, event-loop permits, or stream partitions (``runs_on`` says which);
    ``None`` when too little is declared to size it (the runtime's default applies).
    ``capacity`` is units per second that can be served (``concurrency`` — capped by the
    cores for computing — ÷ ``est``) and ``utilisation`` is ``rate / capacity``: above 1
    the backlog grows without end, whatever the queue.
    """

    rate: float | None = None  # λ, arrivals per second
    est: float | None = None  # W, seconds per unit
    in_flight: float | None = None  # L = λ × W
    declared: int | None = None  # concurrency= as declared
    computing: bool = False  # bound="cpu": one core per unit in flight
    cores: int = 8  # the host's, or assumed
    cores_assumed: bool = True
    cores_needed: float | None = None  # computing work only
    concurrency: int | None = None  # what the decision runs at once
    runs_on: str = ""  # "process workers", "threads", "permits", "partitions", "caller"
    capacity: float | None = None  # units per second the decision serves
    utilisation: float | None = None  # ρ = rate / capacity
    lines: tuple[str, ...] = ()  # the arithmetic, as a person reads it

    @property
    def saturated(self) -> bool:
        return self.utilisation is not None and self.utilisation > 1.0


@dataclass(frozen=True, slots=True)
class Measured:
    """What a measurement found (``foundry profile``, the loop watchdog, live metrics);
    ``None`` fields were not measured. :func:`foundry.decide.reclassify` re-decides with
    them in place of the declared values."""

    est: float | None = None
    bound: str | None = None  # "cpu", "io" or "mixed"
    rate: float | None = None
    releases_gil: bool | None = None
    source: str = "measured"  # who measured, for the record ("foundry profile", "loop watchdog")


@dataclass(frozen=True, slots=True)
class Rejected:
    model: str
    reason: str


@dataclass(frozen=True, slots=True)
class Warning:
    """An anti-pattern the traits (or an override) walk into."""

    code: str  # stable key, e.g. "queue-when-order-matters", "cpu-on-event-loop"
    title: str
    message: str
    fix: str


@dataclass(frozen=True, slots=True)
class Decision:
    """How one unit (or one phase of it) should run, and the bill for it."""

    phase: str
    delivery: str
    execution: str
    decided_by: str  # id of the question that decided execution
    delivery_decided_by: str  # id of the question that decided delivery
    questions: tuple[Answer, ...]
    delivery_bill: Bill
    execution_bill: Bill
    watch: tuple[str, ...]  # metric names (stable, see observe/) to watch
    rejected: tuple[Rejected, ...]
    simpler: str
    warnings: tuple[Warning, ...] = ()
    overridden: bool = False  # an explicit model= chose it
    notes: tuple[str, ...] = field(default=())
    load: Load = field(default_factory=Load)  # the offered load, the chosen size, the arithmetic
    order: str = ""  # how the chosen model keeps the declared order ("" when none is required)

    @property
    def deciding_answer(self) -> str:
        """The execution answer that decided, as the questions recorded it."""
        return _answer(self.questions, "execution", self.decided_by)

    @property
    def delivery_answer(self) -> str:
        """The delivery answer that decided."""
        return _answer(self.questions, "delivery", self.delivery_decided_by)

    @property
    def model(self) -> str:
        return f"{self.delivery}/{self.execution}"


def _answer(questions: tuple[Answer, ...], axis: str, qid: str) -> str:
    for a in questions:
        if a.axis == axis and a.id == qid:
            return a.answer
    return ""
