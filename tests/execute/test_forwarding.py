"""The direct call path: ``unit(...)`` is a wrapper compiled with the function's own
parameters (``foundry.execute.forwarding``), and it behaves exactly like the function —
arguments, errors, tracebacks — while every call is counted."""

from __future__ import annotations

import asyncio
import functools
import threading
import traceback
from typing import Any

import pytest

from foundry import Foundry
from foundry.execute.forwarding import GENERIC, compile_wrapper, forwarding
from foundry.observe import names


def every_kind(
    a: int, b: int = 2, /, c: int = 3, *rest: int, d: int, e: int = 5, **kw: int
) -> tuple[Any, ...]:
    return (a, b, c, rest, d, e, kw)


def test_the_wrapper_takes_exactly_the_functions_parameters(app: Foundry) -> None:
    unit = app.work(model="sequential", name="every_kind")(every_kind)
    assert unit(1, d=4) == every_kind(1, d=4)
    assert unit(1, 2, 3, 4, 5, d=6, z=7) == every_kind(1, 2, 3, 4, 5, d=6, z=7)
    assert unit(1, c=9, d=0) == every_kind(1, c=9, d=0)
    with pytest.raises(TypeError, match=r"every_kind\(\) missing 1 required keyword-only argument: 'd'"):
        unit(1)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        unit(a=1, d=4)  # a is positional-only, as in the function
    labels = {"unit": "every_kind", "model": "sequential"}
    assert app.metrics.value(names.UNIT_COMPLETED, **labels) == 3  # a refused call is not a call
    assert app.metrics.value(names.UNIT_FAILED, **labels) == 0


def test_defaults_are_the_functions_objects_not_copies(app: Foundry) -> None:
    marker: list[int] = []

    def append(x: int, into: list[int] = marker) -> list[int]:
        into.append(x)
        return into

    unit = app.work(model="sequential", name="append")(append)
    assert unit(1) is marker
    assert marker == [1]


def test_a_traceback_names_the_function_and_shows_the_line(app: Foundry) -> None:
    def explode(x: int) -> None:
        raise ValueError(x)

    unit = app.work(model="sequential", name="explode")(explode)
    with pytest.raises(ValueError) as caught:
        unit(3)
    text = "".join(traceback.format_exception(caught.value))
    assert "<foundry sequential unit 'explode'" in text
    assert "_fwd_result = _fwd_fn(x)" in text  # the wrapper's source line (linecache)
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "_fwd_wrapper" not in frames
    assert app.metrics.value(names.UNIT_FAILED, unit="explode") == 1


@pytest.mark.parametrize("name", ["next", "BaseException", "_fwd_fn"])
def test_a_parameter_named_like_the_templates_globals_falls_back_to_the_generic_form(
    app: Foundry, name: str
) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def shadow({name}, other=1):\n    return ({name}, other)\n", namespace)
    fn = namespace["shadow"]
    assert forwarding(fn, frozenset({"next", "BaseException"}))[:2] == GENERIC
    unit = app.work(model="sequential", name="shadow")(fn)
    assert unit(5) == (5, 1)
    assert unit(**{name: 6, "other": 2}) == (6, 2)


def test_callables_without_a_readable_signature_take_the_generic_form(app: Foundry) -> None:
    assert forwarding(max)[:2] == GENERIC  # a C builtin with no signature to read
    unit = app.work(model="sequential", name="maximum")(max)
    assert unit(3, 9, 4) == 9
    assert unit([1, 5], key=lambda v: -v) == 1


def test_a_partial_and_a_decorated_function_are_forwarded_as_they_are_called(app: Foundry) -> None:
    def add(a: int, b: int) -> int:
        return a + b

    @functools.wraps(add)
    def logged(*args: int, **kwargs: int) -> int:  # the wrapper's own signature is what runs
        return add(*args, **kwargs)

    assert forwarding(logged, frozenset())[:2] == GENERIC
    assert app.work(model="sequential", name="logged")(logged)(1, b=2) == 3
    assert app.work(model="sequential", name="plus_ten")(functools.partial(add, 10))(5) == 15


def test_compile_wrapper_binds_state_per_wrapper() -> None:
    template = """
def _fwd_wrapper({params}):
    nonlocal _fwd_n
    _fwd_n += 1
    return _fwd_fn({args}), _fwd_n
"""
    first = compile_wrapper(template, name="f", fn=abs, free={"_fwd_fn": abs, "_fwd_n": 0}, label="t")
    second = compile_wrapper(template, name="g", fn=abs, free={"_fwd_fn": abs, "_fwd_n": 0}, label="t")
    assert first(-1) == (1, 1)
    assert first(-2) == (2, 2)
    assert second(-3) == (3, 1)  # its own counter


def test_calls_from_many_threads_are_all_counted(app: Foundry) -> None:
    unit = app.work(model="sequential", name="inc")(lambda x: x + 1)
    threads = [threading.Thread(target=lambda: [unit(i) for i in range(20_000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    labels = {"unit": "inc", "model": "sequential"}
    assert app.metrics.value(names.UNIT_COMPLETED, **labels) == 80_000
    assert app.metrics.value(names.UNIT_IN_FLIGHT, **labels) == 0
    assert 0 < app.metrics.value(names.UNIT_DURATION, **labels) < 80_000  # a sample, documented


def test_after_the_app_closes_the_next_call_runs_on_a_new_runner(app: Foundry) -> None:
    unit = app.work(model="sequential", name="double")(lambda x: 2 * x)
    assert unit(2) == 4
    first = unit.runner
    app.close()  # closes the runner; the unit forgets it and the call it installed
    assert unit(3) == 6
    assert unit.runner is not first
    assert app.metrics.value(names.UNIT_COMPLETED, unit="double", model="sequential") == 2


def test_an_async_unit_is_awaited_from_a_loop_and_run_without_one(app: Foundry) -> None:
    async def triple(x: int) -> int:
        await asyncio.sleep(0)
        return 3 * x

    unit = app.work(model="sequential", name="triple")(triple)
    assert unit(2) == 6  # no loop running: run to completion

    async def main() -> int:
        return int(await unit(3))

    assert asyncio.run(main()) == 9
