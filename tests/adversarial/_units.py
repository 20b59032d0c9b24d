"""The units of the adversarial tests, and the error types they raise (an isolated
child and a worker in another process import them by name).

``QuotaError`` lives in the units' own module, so a reader that declares these units
rebuilds it by type, with its fields; ``OtherError`` comes from another module and is
rebuilt only when registered (``errors=[...]`` or ``app.errors.register``). Tests that
need other traits declare the functions on their own app.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from foundry import Foundry
from foundry.errors import ChildCrashedError, DeclarationError
from tests.adversarial._other import OtherError


class QuotaError(Exception):
    def __init__(self, account: str, limit: int) -> None:
        self.account = account
        self.limit = limit
        super().__init__(f"account {account!r} is over its quota of {limit}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.account, self.limit))


def add(a: int, b: int) -> int:
    return a + b


def echo(value: Any) -> Any:
    return value


def over_quota(account: str) -> None:
    error = QuotaError(account, 10)
    error.retry_after = 30  # type: ignore[attr-defined]  # an attribute set after construction
    raise error


def other(message: str) -> None:
    raise OtherError(message)


def crashed(unit: str) -> None:
    raise ChildCrashedError(unit, -11, "SIGSEGV")


def value_error(message: str) -> None:
    raise ValueError(message)


def segfault(how: str) -> str:
    """Dies natively: ``"segv"`` dereferences NULL, ``"exit"`` calls ``os._exit(3)``."""
    if how == "segv":
        ctypes.string_at(0)
    if how == "exit":
        os._exit(3)
    return how


def refuse(value: Any) -> None:
    """Raises a Foundry error with structured fields beyond its message."""
    raise DeclarationError("inner", "colour", value, "is not a colour", 'give "red" or "blue"')


def blob(size: int) -> str:
    """A result of ``size`` bytes once JSON-encoded (quotes included)."""
    return "x" * (size - 2)


def length(value: str) -> int:
    return len(value)


class Unreadable(dict[str, Any]):
    """A mapping whose items cannot be read (as a buggy user type might)."""

    def items(self) -> Any:
        raise RuntimeError("items() is broken")

    def values(self) -> Any:
        raise RuntimeError("values() is broken")


def unreadable() -> Any:
    return Unreadable(a=1)


def nested(depth: int) -> Any:
    """A result nested ``depth`` lists deep (too deep for the JSON encoder at 100 000)."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def declare(app: Foundry) -> Foundry:
    """Declare the queue units on ``app`` (durable: the queue model)."""
    for fn in (add, over_quota, other, crashed, value_error):
        app.work(durable=True)(fn)
    app.work(durable=True, codec="pickle", name="pickled_echo")(echo)
    app.work(durable=True, errors=[OtherError], name="other_declared")(other)
    return app
