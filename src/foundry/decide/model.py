"""The shape of a decision. Pure data; no behaviour beyond formatting helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Answer", "Bill", "Decision", "Host", "Rejected", "Warning"]


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

    @property
    def model(self) -> str:
        return f"{self.delivery}/{self.execution}"
