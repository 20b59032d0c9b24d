"""`foundry advise`: the decision engine's questions, asked in order, stopping at the
first that decides on each axis (isolation is always asked: it overrides the rest).

Interactive by default: prompts go to stderr, answers are read from stdin one line
each, and an empty line or end of input means "not declared" — so it never hangs
without a terminal (``foundry advise < /dev/null`` decides on nothing declared).
Scripts give the same answers as flags (``--est 35ms --bound cpu ...``); with any
flag given nothing is asked unless ``--ask`` is passed too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from foundry.cli._target import Problem, reports_problems
from foundry.cli._target import console as make_console
from foundry.decide import Host, decide
from foundry.decide.questions import (
    ALWAYS_ASKED,
    DELIVERY_QUESTIONS,
    EXECUTION_QUESTIONS,
    ISOLATION,
    LATENCY_BUDGET,
)
from foundry.errors import DeclarationError
from foundry.traits import Traits, parse_duration, parse_rate, traits_from_kwargs

Answers = dict[str, Any]

# trait -> (flag type, prompt). Booleans are y/n; the rest go through the trait parser.
_BOOL = "bool"
TRAIT_PROMPTS: dict[str, tuple[str, str]] = {
    "multi_step": (_BOOL, "several steps across services?"),
    "compensate": (_BOOL, "must earlier steps be undone when a later one fails for good?"),
    "durable": (_BOOL, "must it survive a crash of the process that accepted it?"),
    "ordered": (_BOOL, "is output order a requirement?"),
    "key": ("str", "the field that orders and partitions it (e.g. session_id)"),
    "consumers": ("int", "how many independent consumers need every event?"),
    "replay": (_BOOL, "must consumers be able to re-read history?"),
    "rate": ("str", 'arrival rate (e.g. "300/s", "50/day")'),
    "background": (_BOOL, "is it background work nobody waits for?"),
    "latency": ("str", 'latency budget a caller waits within (e.g. "50ms")'),
    "idempotent": (_BOOL, "does running it twice have the same effect as once?"),
    "est": ("str", 'how long one unit takes (e.g. "35ms", "90s")'),
    "concurrency": ("int", "how many units are in flight at once?"),
    "bound": ("str", "computing (cpu), waiting (io) or mixed?"),
    "partitionable": (_BOOL, "is it one big computation over in-memory data that splits into chunks?"),
    "items": ("int", "how many items does it split into?"),
    "stages": ("int", "how many stages hand data on to each other (1 if none)?"),
    "shares": ("list", "state two units both touch (comma-separated rows, files, caches; empty if none)"),
    "long_running": (_BOOL, "is one unit long-running (seconds to hours)?"),
    "releases_gil": (_BOOL, "is the computing native code that releases the GIL (hashlib, zlib, numpy)?"),
    "isolate": (_BOOL, "must a crash be contained (untrusted, crash-prone or leaky native code)?"),
}
_EXTRA_FLAGS: dict[str, str] = {
    "workers": "int",
    "waits_on_pool": _BOOL,
    "model": "str",
    "max_pending": "int",
    "overflow": "str",
    "retries": "int",
    "timeout": "str",
}

Ask = list[tuple[str, Callable[[Answers], bool]]]


def _always(a: Answers) -> bool:
    return True


def _yes(name: str) -> Callable[[Answers], bool]:
    return lambda a: a.get(name) is True


def _fast_rate(a: Answers) -> bool:
    try:
        return "rate" in a and parse_rate(a["rate"]) >= 1000
    except DeclarationError:
        return False


def _tight_latency(a: Answers) -> bool:
    try:
        return "latency" in a and parse_duration(a["latency"]) <= LATENCY_BUDGET
    except DeclarationError:
        return False


def _cpu(a: Answers) -> bool:
    return a.get("bound") == "cpu"


def _no_est(a: Answers) -> bool:
    return "est" not in a


# question id -> the traits it needs, each asked only when its condition holds
ASKS: dict[str, Ask] = {
    "steps": [("multi_step", _always), ("compensate", _yes("multi_step"))],
    "durable": [
        ("durable", _always),
        ("ordered", _yes("durable")),
        ("key", _yes("ordered")),
        ("consumers", _yes("durable")),
        ("replay", _yes("durable")),
        ("rate", _yes("durable")),
    ],
    "fanout": [("consumers", _always), ("replay", _always)],
    "order": [("ordered", _always), ("background", _yes("ordered"))],
    "throughput": [("rate", _always), ("background", _fast_rate)],
    "latency": [("latency", _always), ("idempotent", _tight_latency)],
    "background": [("background", _always)],
    "size": [("est", _always), ("rate", _always), ("concurrency", _always)],
    "bound": [
        ("bound", _always),
        ("partitionable", _cpu),
        ("items", _yes("partitionable")),
        ("releases_gil", _cpu),
    ],
    "independence": [("stages", _always), ("shares", _always)],
    "ordering": [("ordered", _always), ("key", _yes("ordered"))],
    "count": [("concurrency", _always)],
    "duration": [("long_running", _no_est)],
    "isolation": [("isolate", _always)],
}


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "advise",
        help="answer the questions in order; get the model, its bill and its warnings",
        description="Asks the decision engine's questions in order, stopping at the first that "
        "decides on each axis. Give the answers as flags to skip the questions.",
    )
    parser.add_argument("--name", default="work", help="the unit's name in the output")
    for trait, (kind, prompt) in [*TRAIT_PROMPTS.items(), *((k, (v, "")) for k, v in _EXTRA_FLAGS.items())]:
        flag = "--" + trait.replace("_", "-")
        if kind == _BOOL:
            parser.add_argument(
                flag, dest=trait, action=argparse.BooleanOptionalAction, default=None, help=prompt
            )
        elif kind == "list":
            parser.add_argument(flag, dest=trait, action="append", default=None, help=prompt)
        else:
            parser.add_argument(flag, dest=trait, default=None, help=prompt or None)
    parser.add_argument(
        "--phase",
        action="append",
        default=[],
        metavar="NAME:TRAIT=VALUE,...",
        help='a phase with its own traits, e.g. --phase "sign:est=35ms,bound=cpu"',
    )
    parser.add_argument("--ask", action="store_true", help="ask for the answers not given as flags")
    parser.add_argument(
        "--cores", default=None, help="decide for a host with this many cores (default: this one)"
    )
    parser.add_argument(
        "--gil",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decide for an interpreter with (--gil) or without (--no-gil) the GIL (default: this one)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"phases": [{"name", "delivery", "execution", "decided_by", "why", "costs", '
        '"fails", "watch", "warnings"}]}',
    )
    parser.set_defaults(func=run)


def _flag_answers(args: argparse.Namespace) -> Answers:
    answers: Answers = {}
    for trait, (kind, _) in [*TRAIT_PROMPTS.items(), *((k, (v, "")) for k, v in _EXTRA_FLAGS.items())]:
        value = getattr(args, trait, None)
        if value is None:
            continue
        if kind == "int":
            value = _int(trait, value)
        answers[trait] = value
    return answers


def _int(trait: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Problem(
            f"{trait}={text!r} is not a whole number. Fix: give e.g. --{trait.replace('_', '-')} 8", 2
        ) from None


def _parse_phase(spec: str) -> tuple[str, Answers]:
    name, sep, body = spec.partition(":")
    if not sep or not name:
        raise Problem(
            f"--phase {spec!r} is not NAME:TRAIT=VALUE,... Fix: write e.g. sign:est=35ms,bound=cpu", 2
        )
    answers: Answers = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise Problem(f"--phase {spec!r}: {item!r} is not TRAIT=VALUE. Fix: write e.g. bound=cpu", 2)
        kind = TRAIT_PROMPTS.get(key, (_EXTRA_FLAGS.get(key, "str"), ""))[0]
        if kind == _BOOL:
            answers[key] = value.lower() in ("1", "true", "yes", "y")
        elif kind == "int":
            answers[key] = _int(key, value)
        elif kind == "list":
            answers[key] = [v for v in value.split("+") if v]
        else:
            answers[key] = value
    return name, answers


class Asker:
    """Prompts on ``err``, reads ``inp`` a line at a time; EOF ends all asking."""

    def __init__(self, inp: TextIO, err: TextIO) -> None:
        self.inp = inp
        self.err = err
        self.eof = False

    def say(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def line(self, prompt: str) -> str | None:
        if self.eof:
            return None
        self.err.write(prompt)
        self.err.flush()
        raw = self.inp.readline()
        if raw == "":
            self.eof = True
            self.err.write("\n")
            return None
        if not _is_tty(self.inp):
            self.err.write(raw if raw.endswith("\n") else raw + "\n")  # show piped answers
        return raw.strip()

    def trait(self, unit: str, trait: str, answers: Answers, base: Traits | None) -> None:
        kind, prompt = TRAIT_PROMPTS[trait]
        hint = " [y/n]" if kind == _BOOL else ""
        if base is not None and getattr(base, trait) not in (None, False, ()):
            hint += f" (Enter keeps the unit's: {getattr(base, trait)})"
        while True:
            text = self.line(f"    {trait}: {prompt}{hint} ")
            if not text:
                return  # not declared
            try:
                value = _convert(kind, text)
                traits_from_kwargs(unit, {**answers, trait: value}, base=base)
            except (ValueError, DeclarationError) as exc:
                self.say(f"    ! {exc}")
                continue
            answers[trait] = value
            return


def _convert(kind: str, text: str) -> Any:
    if kind == _BOOL:
        if text.lower() in ("y", "yes", "true", "1"):
            return True
        if text.lower() in ("n", "no", "false", "0"):
            return False
        raise ValueError(f"{text!r} is not yes or no. Fix: answer y or n")
    if kind == "int":
        if not text.isdigit():
            raise ValueError(f"{text!r} is not a whole number. Fix: answer e.g. 8")
        return int(text)
    if kind == "list":
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _traits(unit: str, answers: Answers, base: Traits | None = None) -> Traits:
    try:
        return traits_from_kwargs(unit, answers, base=base)
    except DeclarationError as exc:
        raise Problem(str(exc), 2) from exc


def _walk_axis(
    asker: Asker,
    unit: str,
    axis: str,
    answers: Answers,
    base: Traits | None,
    skip: set[str],
    host: Host,
) -> None:
    questions = DELIVERY_QUESTIONS if axis == "delivery" else (*EXECUTION_QUESTIONS, ISOLATION)
    asked: set[str] = set()
    decided = False
    for number, q in enumerate(questions, 1):
        if decided and q.id not in ALWAYS_ASKED:
            continue  # stop at the first that decides; duration and isolation are still asked
        asker.say(f"  [{axis} {number}/{len(questions)}] {q.text}")
        for trait, when in ASKS[q.id]:
            if trait not in answers and trait not in skip and when(answers):
                asker.trait(unit, trait, answers, base)
        asked.add(q.id)
        decision = decide(_traits(unit, answers, base), host=host)
        answer = next((a for a in decision.questions if a.axis == axis and a.id == q.id), None)
        by = decision.delivery_decided_by if axis == "delivery" else decision.decided_by
        model = decision.delivery if axis == "delivery" else decision.execution
        if answer is None:  # this answer let an earlier question decide
            asker.say(f"    -> decided above by {by}: {model}")
            decided = True
        elif answer.decided or by in asked:
            asker.say(f"    -> {answer.answer}  [decides: {model}]")
            decided = True
        else:
            asker.say(f"    -> {answer.answer}")


def _interview(asker: Asker, name: str, answers: Answers, host: Host) -> dict[str, Answers]:
    given = set(answers)
    asker.say(f"Deciding how {name!r} should run. Enter leaves a question not declared.")
    _walk_axis(asker, name, "delivery", answers, None, given, host)
    _walk_axis(asker, name, "execution", answers, None, given, host)
    phases: dict[str, Answers] = {}
    base = _traits(name, answers).merged(model=None)
    while True:
        phase = asker.line(
            "  Does part of it run differently (e.g. a CPU step in a waiting handler)? "
            "Name the phase, or Enter to finish: "
        )
        if not phase:
            return phases
        if phase == "main" or phase in phases:
            asker.say(f"    ! {phase!r} is taken; pick another name")
            continue
        own: Answers = {}
        _walk_axis(asker, f"{name}.{phase}", "execution", own, base, set(), host)
        phases[phase] = own


def _host(args: argparse.Namespace) -> Host:
    """This host (what `foundry plan` decides for too), or the one the flags describe."""
    from foundry.profile import current_host

    here = current_host()
    cores = here.cores if args.cores is None else _int("cores", args.cores)
    if cores is not None and cores < 1:
        raise Problem(f"--cores {cores} is out of range. Fix: give --cores 1 or more", 2)
    return Host(cores=cores, gil=here.gil if args.gil is None else args.gil)


@reports_problems("advise")
def run(args: argparse.Namespace) -> int:
    from foundry.units import decide_phases

    name = args.name
    host = _host(args)
    answers = _flag_answers(args)
    phases = dict(_parse_phase(spec) for spec in args.phase)
    if (not answers and not phases) or args.ask:
        asker = Asker(sys.stdin, sys.stderr)
        phases.update(_interview(asker, name, answers, host))
    traits = _traits(name, answers)
    try:
        main, decided = decide_phases(name, traits, phases, host)
    except DeclarationError as exc:
        raise Problem(str(exc), 2) from exc
    if args.json:
        from foundry.explain import phase_summary

        body = {"phases": [phase_summary(d) for d in (main, *decided.values())]}
        json.dump(body, sys.stdout, indent=2)
        print()
        return 0
    from foundry.explain import explain_renderables

    make_console().print(explain_renderables(name, main, decided))
    return 0
