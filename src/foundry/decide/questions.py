"""The questions of both axes, in order, and the walk that stops at the first that decides.

Delivery (seed 000's framework) is asked of the unit as a whole: steps, durable,
fan-out, order, throughput, latency, background, then the fallback (direct).

Execution (seed 003's seven questions) is asked per phase: size, bound,
independence, ordering, count, duration, isolation. The walk stops at the first that
decides, except that **duration and isolation are always asked**: duration constrains
whatever model carries long work (timeouts, cancellation, checkpoints), and isolation
overrides everything above it. Then the fallback (sequential).

The count question decides from the *load*, not from labels: units in flight by
Little's law (``rate × est``), the cores computing work needs against the host's, and
whether threads can use those cores at all (the GIL; ``releases_gil``) — see
:mod:`foundry.decide.load`. Order is a constraint, not a selector: a key never makes
concurrent work sequential; the engine says how the chosen model keeps the order
(:mod:`foundry.decide.advice`).

Each question is a pure function ``(Ctx) -> Step``: the answer as a person reads it, the
model it chooses (``None`` when it does not decide) and an optional note that travels
into the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from foundry.decide.fmt import fmt_count, fmt_rate, fmt_seconds
from foundry.decide.load import ASSUMED_CORES, Demand, demand
from foundry.decide.model import Answer, Host
from foundry.traits import Traits

__all__ = [
    "ASSUMED_CORES",
    "ASYNC_MIN",
    "DELIVERY_QUESTIONS",
    "EXECUTION_QUESTIONS",
    "FALLBACK",
    "HIGH_THROUGHPUT",
    "ISOLATION",
    "LATENCY_BUDGET",
    "PARALLEL_MIN_ITEMS",
    "SMALL_EST",
    "Ctx",
    "Question",
    "Step",
    "Walk",
    "fmt_in_flight",
    "fmt_rate",
    "fmt_seconds",
    "in_flight",
    "walk_delivery",
    "walk_execution",
]

# Thresholds, named so docs/decisions.md and the tests can point at them.
SMALL_EST = 0.005  # "under a few milliseconds" (seed 003: the only size that decides on its own)
LONG_EST = 10.0  # long-running (Traits.is_long uses the same 10 s)
VOLUME_RATE = 10.0  # arrivals per second that count as "repeated at volume"
HIGH_THROUGHPUT = 1000.0  # per second: the framework's "high throughput"
LATENCY_BUDGET = 0.050  # the framework's "latency under 50 ms"
ASYNC_MIN = 64  # in flight at once: from here on threads' stacks stop scaling, async wins
PARALLEL_MIN_ITEMS = 10_000  # below this a partitioned map is slower than a loop


@dataclass(frozen=True, slots=True)
class Step:
    answer: str
    choice: str | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Ctx:
    """What every question may read: the traits, the host, the offered load, and (for
    the execution questions) the delivery already chosen."""

    traits: Traits
    host: Host
    demand: Demand
    delivery: str = ""


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    axis: str
    text: str
    ask: Callable[[Ctx], Step]
    always: bool = False  # asked even after an earlier question decided


@dataclass(frozen=True, slots=True)
class Walk:
    """The result of walking one axis."""

    choice: str
    decided_by: str
    answers: tuple[Answer, ...]
    notes: tuple[str, ...]


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
    return "not declared" if n is None else f"~{fmt_count(n)} (rate x est)"


def _volume(c: Ctx) -> str:
    """Why the work is "repeated at volume", or "" when it is not."""
    t, d = c.traits, c.demand
    if t.rate is not None and t.rate >= VOLUME_RATE:
        return f"rate {fmt_rate(t.rate)}"
    if d.declared is not None and d.declared >= 2:
        return f"{d.declared} in flight"
    if d.slots is not None and d.slots >= 2:
        return d.describe()
    if t.partitionable and (t.items is None or t.items >= PARALLEL_MIN_ITEMS):
        return "a large partitionable input"
    return ""


# -- delivery: seed 000's framework ----------------------------------------------


def _steps(c: Ctx) -> Step:
    t = c.traits
    if t.compensate:
        return Step("yes: steps that must be undone when a later one fails for good", "workflow")
    if t.multi_step and (t.durable or t.is_long):
        why = "durable" if t.durable else "long-running"
        return Step(f"yes: several steps, {why}, each of which can fail and be retried", "workflow")
    if t.multi_step:
        return Step("several steps, but short, not durable and nothing to undo: a function calling functions")
    return Step("no: one step")


def _durable(c: Ctx) -> Step:
    t = c.traits
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


def _fanout(c: Ctx) -> Step:
    t = c.traits
    if (t.consumers or 1) > 1 or t.replay:
        parts = []
        if (t.consumers or 1) > 1:
            parts.append(f"{t.consumers} independent consumers each need every event")
        if t.replay:
            parts.append("consumers must re-read history")
        return Step("yes: " + "; ".join(parts), "stream")
    return Step("no: one consumer, no replay")


def _order(c: Ctx) -> Step:
    t = c.traits
    if t.ordered and t.background:
        return Step("yes, across a hand-off: a queue would reorder it, a log keeps it", "stream")
    if t.ordered:
        return Step("yes, but the caller runs it in place, which keeps order: no log needed")
    return Step("no")


def _throughput(c: Ctx) -> Step:
    t = c.traits
    if t.rate is None:
        return Step("not declared")
    if t.rate >= HIGH_THROUGHPUT and t.background:
        return Step(f"{fmt_rate(t.rate)} handed off in the background: a log absorbs it", "stream")
    return Step(f"{fmt_rate(t.rate)}: not a reason for a log on its own")


def _latency(c: Ctx) -> Step:
    t = c.traits
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


def _background(c: Ctx) -> Step:
    t = c.traits
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
    lambda c: Step("yes: simple work, no coordination needed", "direct"),
)


# -- execution: seed 003's seven questions ----------------------------------------


def _size(c: Ctx) -> Step:
    t = c.traits
    if t.est is None:
        return Step("not declared (declare est=, or measure it with `foundry profile`)")
    est = fmt_seconds(t.est)
    volume = _volume(c)
    if volume:
        return Step(f"{est} per unit, repeated at volume ({volume}): keep asking")
    if t.est < SMALL_EST:
        return Step(f"{est}, not repeated at volume: too small for any coordination to pay", "sequential")
    return Step(f"{est}: not under a few milliseconds, so size alone does not decide; the load does")


def _bound(c: Ctx) -> Step:
    t, d = c.traits, c.demand
    if t.bound is None:
        return Step("not declared (declare bound=, or measure the CPU/wall ratio with `foundry profile`)")
    if t.bound == "io":
        if t.partitionable:
            return Step("waiting: more in flight helps (partitionable ignored: it is for in-memory compute)")
        return Step("waiting: more in flight helps; the load decides how many")
    if t.bound == "mixed":
        return Step("mixed: split the computing part into its own phase; the load decides how many")
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
    needed = d.cores_needed
    cores = f"{d.cores} assumed" if d.cores_assumed else str(d.cores)
    need = f"{fmt_count(needed)} cores needed of {cores}" if needed is not None else f"{cores} cores"
    if c.host.gil is False:
        how = "this interpreter has no GIL, so threads use the cores"
    elif t.releases_gil:
        how = "releases_gil=True: native code runs outside the GIL, so threads use the cores"
    else:
        how = (
            "pure Python under the GIL (assumed; check sys._is_gil_enabled())"
            if c.host.gil is None
            else "pure Python under the GIL"
        ) + ": threads take turns on one core, process workers use several"
    return Step(f"computing ({need}); {how}; the load decides how many")


def _gil_note(host: Host) -> str:
    which = (
        "assumed CPython with the GIL (check sys._is_gil_enabled())"
        if host.gil is None
        else "this interpreter has the GIL (sys._is_gil_enabled() is True, or absent before 3.13)"
    )
    return (
        f"{which}: threads run Python bytecode one at a time, so computing that needs several cores "
        "runs on process workers; if the work is native code that releases the GIL (hashlib on large "
        "buffers, zlib, cryptography, numpy), declare releases_gil=True and a thread pool does it "
        "without pickling (`foundry profile` measures it)"
    )


def _independence(c: Ctx) -> Step:
    t, d = c.traits, c.demand
    if t.stages is not None and t.stages >= 2:
        return Step(
            f"{t.stages} stages hand data on to each other: pass it through channels, share nothing",
            "channels",
        )
    shared = ", ".join(t.shares)
    if t.shares and d.single:
        return Step(f"units share {shared}, but one runs at a time: nothing to lock")
    if t.shares and t.bound == "cpu":
        return Step(
            f"no: units share {shared} and compute on it: threads with locks",
            "threads",
            note=f"guard {shared} with a lock each and write down its invariant",
        )
    if t.shares:
        how = f"serialise per {t.key}" if t.key else "serialise per key (declare key=) or lock it"
        return Step(
            f"no: units share {shared}; {how}",
            note=f"two units touch {shared}: {how}; a transaction or row lock is the usual guard",
        )
    return Step("yes, nothing shared declared (list rows, files, caches, counters in shares=)")


def _ordering(c: Ctx) -> Step:
    t, d = c.traits, c.demand
    if not t.ordered:
        return Step("no")
    if not _volume(c) and not (d.known and not d.single):
        return Step("yes, and nothing at volume: keep it in order by running it in order", "sequential")
    if t.key:
        return Step(
            f"yes, per {t.key}: a constraint, not a model; the load picks the model and per-{t.key} "
            "order is kept on it (see how order is kept)"
        )
    return Step(
        "yes: restore order at the join rather than preserve it during execution; the load picks the model"
    )


def _count(c: Ctx) -> Step:
    t, d = c.traits, c.demand
    if not d.known:
        if t.rate is not None:
            return Step(
                f"rate {fmt_rate(t.rate)} declared, but no est= to turn it into units in flight "
                "(declare est=, or measure it with `foundry profile`)"
            )
        return Step("not declared (declare concurrency=, or rate= with est=)")
    shown = d.describe()
    slots = d.slots
    assert slots is not None
    if c.delivery == "stream":
        return Step(
            f"{shown}: a partition's owner handles one event at a time, in order; spread them over "
            f"≥ {slots} partitions",
            "sequential",
        )
    # "one worker would be busy 180 %" says why ~1.8 in flight is not one at a time; at 120
    # in flight it says nothing the count does not.
    from_load = (
        d.in_flight is not None and d.in_flight < 4 and (d.declared is None or d.declared <= d.in_flight)
    )
    busy = f"one worker would be busy {d.in_flight:.0%} of the time" if from_load and d.in_flight else ""
    if d.single:
        why = f"{busy} and keeps up" if busy else "one at a time"
        return Step(f"{shown}: {why}", "sequential")
    over = f"; {busy}" if busy and d.in_flight is not None and d.in_flight >= 0.5 else ""
    if d.computing:
        if d.cores == 1:
            return Step(
                f"{shown}{over}, computing on 1 core: nothing computes in parallel here; one at a time",
                "sequential",
            )
        workers = min(slots, d.cores)
        if d.threads_use_cores:
            return Step(
                f"{shown}{over}, computing; threads use cores here: {workers} threads (one per core at most)",
                "bounded_pool",
            )
        return Step(
            f"{shown}{over}, computing in pure Python under the GIL: threads would take turns on one "
            f"core, {workers} process workers use {workers} cores",
            "processes",
            note=_gil_note(c.host),
        )
    if t.bound == "io" and slots >= ASYNC_MIN:
        return Step(
            f"{shown}{over}: {slots} waiting at once; thread stacks do not scale to that, tasks do",
            "async",
        )
    kind = {"io": "waiting", "mixed": "mixed work"}.get(t.bound or "", "work of undeclared kind")
    return Step(f"{shown}{over}: {slots} {kind} at once, capped by a pool", "bounded_pool")


def _duration(c: Ctx) -> Step:
    t = c.traits
    if t.is_long:
        how = fmt_seconds(t.est) if t.est is not None else "long_running=True"
        return Step(
            f"yes ({how} per unit): timeouts, cancellation and checkpoints become mandatory; it "
            "constrains the model, it does not choose one"
        )
    if t.est is not None:
        return Step(f"no: {fmt_seconds(t.est)} per unit")
    if t.long_running is not None:
        return Step("no (long_running=False)")
    return Step("not declared (declare est=, or long_running=True)")


def _isolation(c: Ctx) -> Step:
    t = c.traits
    if t.isolate:
        return Step(
            "yes: a crash must be contained; processes, whatever the answers above said",
            "processes",
        )
    return Step("no" if t.est is not None or t.bound is not None else "not declared (assumed no)")


EXECUTION_QUESTIONS: tuple[Question, ...] = (
    Question("size", "execution", "Is the unit small (under a few ms), and not repeated at volume?", _size),
    Question("bound", "execution", "Is it computing (CPU) or waiting (I/O)?", _bound),
    Question(
        "independence", "execution", "Are the units independent: what state do two touch?", _independence
    ),
    Question("ordering", "execution", "Is output order a requirement?", _ordering),
    Question("count", "execution", "How many units are in flight at once (the load)?", _count),
    Question("duration", "execution", "Is a unit long-running?", _duration, always=True),
)
ISOLATION = Question(
    "isolation",
    "execution",
    "Must a crash be contained (untrusted, crash-prone, leaky code)?",
    _isolation,
    always=True,
)
FALLBACK = Question(
    "fallback",
    "execution",
    "Nothing above decided: run it sequentially, the model the others must beat?",
    lambda c: Step("yes: no answer above justified a concurrent model", "sequential"),
)
ALWAYS_ASKED = frozenset(q.id for q in (*EXECUTION_QUESTIONS, ISOLATION) if q.always)


def _walk(questions: tuple[Question, ...], c: Ctx) -> tuple[list[Answer], list[str], str | None, int]:
    """Ask in order; after the first that decides, only the ``always`` questions."""
    answers: list[Answer] = []
    notes: list[str] = []
    choice: str | None = None
    at = -1
    for q in questions:
        if choice is not None and not q.always:
            continue
        step = q.ask(c)
        decides = choice is None and step.choice is not None
        answers.append(Answer(q.id, q.axis, q.text, step.answer, decides))
        if step.note:
            notes.append(step.note)
        if decides:
            choice, at = step.choice, len(answers) - 1
    return answers, notes, choice, at


def walk_delivery(t: Traits, host: Host) -> Walk:
    c = Ctx(t, host, demand(t, host))
    answers, notes, choice, _ = _walk(DELIVERY_QUESTIONS, c)
    if choice is None:
        more, _, choice, _ = _walk((DELIVERY_FALLBACK,), c)
        answers += more
    assert choice is not None
    return Walk(choice, answers[-1].id, tuple(answers), tuple(notes))


def walk_execution(t: Traits, host: Host, delivery: str = "direct") -> Walk:
    c = Ctx(t, host, demand(t, host), delivery)
    answers, notes, choice, at = _walk(EXECUTION_QUESTIONS, c)
    iso = ISOLATION.ask(c)
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
    more, _, fallback, _ = _walk((FALLBACK,), c)
    assert fallback is not None
    return Walk(fallback, FALLBACK.id, tuple(answers + more), tuple(notes))
