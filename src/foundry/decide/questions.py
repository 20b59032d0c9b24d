"""The questions of both axes, in order, and the walk that stops at the first that decides.

Delivery (seed 000's framework) is asked of the unit as a whole: steps, durable,
fan-out, order, throughput, latency, background, then the fallback (direct).

Execution (seed 003's seven questions) is asked per phase: size, bound,
independence, ordering, count, duration; then isolation, which is always asked
because it overrides everything above it; then the fallback (sequential).

Each question is a pure function ``(Traits, Host) -> Step``: the answer as a person
reads it, the model it chooses (``None`` when it does not decide) and an optional
note that travels into the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from foundry.decide.model import Answer, Host
from foundry.traits import Traits

__all__ = [
    "ASSUMED_CORES",
    "DELIVERY_QUESTIONS",
    "EXECUTION_QUESTIONS",
    "FALLBACK",
    "HIGH_THROUGHPUT",
    "ISOLATION",
    "LATENCY_BUDGET",
    "PARALLEL_MIN_ITEMS",
    "Question",
    "Step",
    "Walk",
    "fmt_in_flight",
    "fmt_seconds",
    "in_flight",
    "walk_delivery",
    "walk_execution",
]

# Thresholds, named so docs/decisions.md and the tests can point at them.
SMALL_EST = 0.005  # "under a few milliseconds"
LONG_EST = 10.0  # long-running (Traits.is_long uses the same 10 s)
LONG_UNIT_EST = 1.0  # a compute unit long enough that process start-up rounds to nothing
VOLUME_RATE = 10.0  # arrivals per second that count as "repeated at volume"
HIGH_THROUGHPUT = 1000.0  # per second: the framework's "high throughput"
LATENCY_BUDGET = 0.050  # the framework's "latency under 50 ms"
ASYNC_MIN = 64  # in flight at once: from here on threads' stacks stop scaling, async wins
PARALLEL_MIN_ITEMS = 10_000  # below this a partitioned map is slower than a loop
ASSUMED_CORES = 8  # when the host is unknown


@dataclass(frozen=True, slots=True)
class Step:
    answer: str
    choice: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    axis: str
    text: str
    ask: Callable[[Traits, Host], Step]


@dataclass(frozen=True, slots=True)
class Walk:
    """The result of walking one axis."""

    choice: str
    decided_by: str
    answers: tuple[Answer, ...]
    notes: tuple[str, ...]


def fmt_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.4g}ms"
    if seconds < 120:
        return f"{seconds:.4g}s"
    if seconds < 7200:
        return f"{seconds / 60:.4g}m"
    return f"{seconds / 3600:.4g}h"


def fmt_rate(per_second: float) -> str:
    if per_second >= 1:
        return f"{per_second:.4g}/s"
    if per_second * 3600 >= 1:
        return f"{per_second * 3600:.4g}/h"
    return f"{per_second * 86400:.4g}/day"


def in_flight(t: Traits) -> float | None:
    """Units in flight at once: declared, or Little's law (rate x est) when both are known."""
    if t.concurrency is not None:
        return float(t.concurrency)
    if t.rate is not None and t.est is not None:
        return t.rate * t.est
    return None


def fmt_in_flight(t: Traits) -> str:
    """How many are in flight, as declared ("300") or derived ("~10.5 (rate x est)")."""
    if t.concurrency is not None:
        return str(t.concurrency)
    n = in_flight(t)
    return "not declared" if n is None else f"~{n:.3g} (rate x est)"


def _at_volume(t: Traits) -> bool:
    n = in_flight(t)
    return (
        (n is not None and n >= 2)
        or (t.rate is not None and t.rate >= VOLUME_RATE)
        or (t.partitionable and (t.items is None or t.items >= PARALLEL_MIN_ITEMS))
    )


def _cores(host: Host) -> int:
    return host.cores if host.cores is not None else ASSUMED_CORES


# -- delivery: seed 000's framework ----------------------------------------------


def _steps(t: Traits, host: Host) -> Step:
    if t.compensate:
        return Step("yes: steps that must be undone when a later one fails for good", "workflow")
    if t.multi_step and (t.durable or t.is_long):
        why = "durable" if t.durable else "long-running"
        return Step(f"yes: several steps, {why}, each of which can fail and be retried", "workflow")
    if t.multi_step:
        return Step("several steps, but short, not durable and nothing to undo: a function calling functions")
    return Step("no: one step")


def _durable(t: Traits, host: Host) -> Step:
    if not t.durable:
        return Step("no (or not declared)")
    needs = _stream_needs(t)
    if needs:
        return Step(f"yes, and {', '.join(needs)}: a log keeps that, a queue does not", "stream")
    return Step("yes; no order, fan-out, replay or high throughput needed: a queue is enough", "queue")


def _stream_needs(t: Traits) -> list[str]:
    needs = []
    if t.ordered:
        needs.append(f"order per {t.key}" if t.key else "order")
    if (t.consumers or 1) > 1:
        needs.append(f"{t.consumers} consumers each need every event")
    if t.replay:
        needs.append("replay")
    if t.rate is not None and t.rate >= HIGH_THROUGHPUT:
        needs.append(f"high throughput ({fmt_rate(t.rate)})")
    return needs


def _fanout(t: Traits, host: Host) -> Step:
    if (t.consumers or 1) > 1 or t.replay:
        parts = []
        if (t.consumers or 1) > 1:
            parts.append(f"{t.consumers} independent consumers each need every event")
        if t.replay:
            parts.append("consumers must re-read history")
        return Step("yes: " + "; ".join(parts), "stream")
    return Step("no: one consumer, no replay")


def _order(t: Traits, host: Host) -> Step:
    if t.ordered and t.background:
        return Step("yes, across a hand-off: a queue would reorder it, a log keeps it", "stream")
    if t.ordered:
        return Step("yes, but the caller runs it in place, which keeps order: no log needed")
    return Step("no")


def _throughput(t: Traits, host: Host) -> Step:
    if t.rate is None:
        return Step("not declared")
    if t.rate >= HIGH_THROUGHPUT and t.background:
        return Step(f"{fmt_rate(t.rate)} handed off in the background: a log absorbs it", "stream")
    return Step(f"{fmt_rate(t.rate)}: not a reason for a log on its own")


def _latency(t: Traits, host: Host) -> Step:
    if t.latency is None:
        return Step("not declared")
    budget = fmt_seconds(t.latency)
    if t.latency > LATENCY_BUDGET:
        return Step(f"{budget}: no tighter than the 50 ms that rules out a hand-off")
    if t.idempotent and not t.shares:
        return Step(
            f"{budget}, idempotent and stateless: interchangeable workers serve it, a failed "
            "request is retried by the client",
            "pool",
        )
    return Step(f"{budget}, and the caller is waiting: run it where the caller is", "direct")


def _background(t: Traits, host: Host) -> Step:
    if t.background:
        return Step("yes: nobody waits for the result; hand it off and let it retry", "queue")
    return Step("no (or not declared): someone waits for the result")


DELIVERY_QUESTIONS: tuple[Question, ...] = (
    Question(
        "steps", "delivery", "Is it several steps across services, undone if a later one fails?", _steps
    ),
    Question("durable", "delivery", "Must it survive a crash of the process that accepted it?", _durable),
    Question("fanout", "delivery", "Do several independent consumers need every event, or replay?", _fanout),
    Question("order", "delivery", "Must items stay in order across a hand-off?", _order),
    Question("throughput", "delivery", "Is it a high-throughput hand-off (1000/s or more)?", _throughput),
    Question("latency", "delivery", "Is a caller waiting within a tight latency budget (50 ms)?", _latency),
    Question("background", "delivery", "Is it background work nobody waits for?", _background),
)
DELIVERY_FALLBACK = Question(
    "simple",
    "delivery",
    "Nothing above needs coordination: does the caller simply run it?",
    lambda t, h: Step("yes: simple work, no coordination needed", "direct"),
)

# -- execution: seed 003's seven questions ----------------------------------------


def _size(t: Traits, host: Host) -> Step:
    if t.est is None:
        return Step("not declared (declare est=, or measure it with `foundry profile`)")
    est = fmt_seconds(t.est)
    if _at_volume(t):
        return Step(f"{est} per unit, repeated at volume: keep asking")
    if t.est < SMALL_EST:
        return Step(f"{est}, not at volume: too small for any coordination to pay", "sequential")
    if t.est < LONG_EST:
        return Step(
            f"{est}, one at a time and not at volume: coordinating it would cost more than it saves",
            "sequential",
        )
    return Step(f"{est}: not small")


def _bound(t: Traits, host: Host) -> Step:
    if t.bound is None:
        return Step("not declared (declare bound=, or measure the CPU/wall ratio with `foundry profile`)")
    if t.bound == "io":
        if t.partitionable:
            return Step("waiting: more in flight helps (partitionable ignored: it is for in-memory compute)")
        return Step("waiting: more in flight helps; how many decides")
    if t.bound == "mixed":
        return Step("mixed: split the computing part into its own phase; how many decides")
    if t.partitionable:
        if t.items is not None and t.items < PARALLEL_MIN_ITEMS:
            return Step(
                f"computing, partitionable, but only {t.items} items: a partitioned map is slower "
                f"than a loop below ~{PARALLEL_MIN_ITEMS}; falling back to sequential",
                "sequential",
                note=f"parallel rejected for size: {t.items} items is below {PARALLEL_MIN_ITEMS}; "
                "declare items= again if the input grows",
            )
        size = f"{t.items} items" if t.items is not None else "input size not declared (assumed large)"
        return Step(f"computing, one partitionable computation in memory ({size})", "parallel")
    n = in_flight(t)
    several = n is not None and n >= 2
    if t.est is not None and t.est >= LONG_UNIT_EST and several:
        if host.gil is False:
            return Step(
                "computing, several long units at once; this interpreter has no GIL, so threads "
                "use cores: how many decides"
            )
        return Step(
            f"computing, {n:.4g} units of {fmt_seconds(t.est)} at once need several cores; under the "
            "GIL threads cannot use them",
            "processes",
            note=_gil_note(host),
        )
    if t.est is not None and t.est >= LONG_UNIT_EST:
        return Step(f"computing, {fmt_seconds(t.est)} per unit, one core each: how many decides")
    return Step("computing: short units, how many decides")


def _gil_note(host: Host) -> str:
    if host.gil is None:
        return (
            "assumed CPython with the GIL: threads run Python bytecode one at a time, so "
            "compute that needs several cores needs processes (check sys._is_gil_enabled())"
        )
    return (
        "this interpreter has the GIL (sys._is_gil_enabled() is True, or the function does not exist "
        "before 3.13): threads run Python bytecode one at a time, so compute that needs several cores "
        "needs processes"
    )


def _independence(t: Traits, host: Host) -> Step:
    if t.stages is not None and t.stages >= 2:
        return Step(
            f"{t.stages} stages hand data on to each other: pass it through channels, share nothing",
            "channels",
        )
    if t.shares and t.bound == "cpu":
        return Step(
            f"no: units share {', '.join(t.shares)} and compute on it: threads with locks",
            "threads",
            note=f"guard {', '.join(t.shares)} with a lock each and write down its invariant",
        )
    if t.shares:
        how = f"serialise per {t.key}" if t.key else "serialise per key (declare key=) or lock it"
        return Step(
            f"no: units share {', '.join(t.shares)}; {how}",
            note=f"two units touch {', '.join(t.shares)}: {how}; a transaction or row lock is the "
            "usual guard",
        )
    return Step("yes, nothing shared declared (list rows, files, caches, counters in shares=)")


def _ordering(t: Traits, host: Host) -> Step:
    if not t.ordered:
        return Step("no")
    if t.key:
        return Step(
            f"yes, per {t.key}: one in-order consumer per partition; scale with partitions, not threads",
            "sequential",
        )
    if not _at_volume(t):
        return Step("yes, and nothing at volume: keep it in order by running it in order", "sequential")
    return Step(
        "yes: restore order at the join rather than preserve it during execution",
        note="order is restored at the join: map(ordered=True) yields results in input order",
    )


def _count(t: Traits, host: Host) -> Step:
    n = in_flight(t)
    if n is None:
        return Step("not declared (declare concurrency=, or rate= with est=)")
    shown = fmt_in_flight(t)
    if n < 2:
        return Step(f"{shown}: one at a time, nothing to overlap", "sequential")
    if t.bound == "io" and n >= ASYNC_MIN:
        return Step(f"{shown} waiting at once: stacks do not scale to that, tasks do", "async")
    if t.bound == "cpu":
        cores = _cores(host)
        note = f"size the pool near the core count ({cores}), not near {shown}"
        if host.gil is not False:
            note += (
                "; under the GIL give it process workers unless the work is native code that "
                "releases the GIL (hashlib, zlib, cryptography, numpy)"
            )
        return Step(f"{shown} short compute tasks: cap them with a pool", "bounded_pool", note=note)
    kind = "mixed work" if t.bound == "mixed" else "work of undeclared kind"
    return Step(f"{shown} at once, {kind}: cap them with a pool", "bounded_pool")


def _duration(t: Traits, host: Host) -> Step:
    if not t.is_long:
        return Step("no" if t.est is not None or t.long_running is not None else "not declared")
    # Duration constrains whatever model carries the work; it does not choose one.
    return Step(
        "yes: long-running; cancellation and timeouts become mandatory (constrains, does not choose)",
        note="long-running: give it timeout= and make it cancellable; sizing its pool is a queueing "
        "problem (`foundry lab`)",
    )


def _isolation(t: Traits, host: Host) -> Step:
    if t.isolate:
        return Step(
            "yes: a crash must be contained; processes, whatever the answers above said",
            "processes",
        )
    return Step("no" if t.est is not None or t.bound is not None else "not declared (assumed no)")


EXECUTION_QUESTIONS: tuple[Question, ...] = (
    Question("size", "execution", "Is the unit small, and not repeated at volume?", _size),
    Question("bound", "execution", "Is it computing (CPU) or waiting (I/O)?", _bound),
    Question(
        "independence", "execution", "Are the units independent: what state do two touch?", _independence
    ),
    Question("ordering", "execution", "Is output order a requirement?", _ordering),
    Question("count", "execution", "How many units are in flight at once?", _count),
    Question("duration", "execution", "Is a unit long-running?", _duration),
)
ISOLATION = Question(
    "isolation", "execution", "Must a crash be contained (untrusted, crash-prone, leaky code)?", _isolation
)
FALLBACK = Question(
    "fallback",
    "execution",
    "Nothing above decided: run it sequentially, the model the others must beat?",
    lambda t, h: Step("yes: no answer above justified a concurrent model", "sequential"),
)


def _walk(
    questions: tuple[Question, ...], t: Traits, host: Host
) -> tuple[list[Answer], list[str], str | None, int]:
    answers: list[Answer] = []
    notes: list[str] = []
    for q in questions:
        step = q.ask(t, host)
        answers.append(Answer(q.id, q.axis, q.text, step.answer, step.choice is not None))
        if step.note:
            notes.append(step.note)
        if step.choice is not None:
            return answers, notes, step.choice, len(answers) - 1
    return answers, notes, None, -1


def walk_delivery(t: Traits, host: Host) -> Walk:
    answers, notes, choice, _ = _walk(DELIVERY_QUESTIONS, t, host)
    if choice is None:
        more, _, choice, _ = _walk((DELIVERY_FALLBACK,), t, host)
        answers += more
    assert choice is not None
    return Walk(choice, answers[-1].id, tuple(answers), tuple(notes))


def walk_execution(t: Traits, host: Host) -> Walk:
    answers, notes, choice, at = _walk(EXECUTION_QUESTIONS, t, host)
    iso = ISOLATION.ask(t, host)
    if iso.choice is not None and choice is not None:
        # Isolation overrides everything above it: the earlier decider is recorded, not obeyed.
        earlier = answers[at]
        answers[at] = Answer(
            earlier.id,
            earlier.axis,
            earlier.question,
            f"{earlier.answer} (would choose {choice}; overridden by isolation)",
            False,
        )
    answers.append(Answer(ISOLATION.id, "execution", ISOLATION.text, iso.answer, iso.choice is not None))
    if iso.choice is not None:
        return Walk(iso.choice, ISOLATION.id, tuple(answers), tuple(notes))
    if choice is not None:
        return Walk(choice, answers[at].id, tuple(answers), tuple(notes))
    more, _, fallback, _ = _walk((FALLBACK,), t, host)
    assert fallback is not None
    return Walk(fallback, FALLBACK.id, tuple(answers + more), tuple(notes))
