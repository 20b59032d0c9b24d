"""Django: ``settings.FOUNDRY`` makes the project's Foundry app, and work is submitted
when the transaction commits.

    # settings.py
    INSTALLED_APPS = [..., "foundry.integrations.django"]
    FOUNDRY = {"queue": "postgresql://…/app", "journal": "postgresql://…/app"}

    # orders/tasks.py (found by the AppConfig: every installed app's ``tasks`` module)
    from foundry.integrations.django import get_app, submit_on_commit
    app = get_app()

    @app.work(durable=True)
    def send_confirmation(order_id: int) -> None: ...

    # orders/views.py
    with transaction.atomic():
        order = Order.objects.create(...)
        submit_on_commit(send_confirmation, order.id)   # enqueued only if this commits

Workers: ``DJANGO_SETTINGS_MODULE=mysite.settings foundry run foundry.integrations.django:app``
(``foundry worker`` likewise): the attribute ``app`` of this module sets Django up
(``django.setup()``, so the ``tasks`` modules are imported) and is the project's app.

``FOUNDRY`` keys are :class:`~foundry.Foundry`'s (``name``, ``home``, ``queue``,
``stream``, ``journal``, ``pool``, ``cluster``, ``watchdog``, ``tracing``) and ``tasks``
(the module name looked for in each installed app, ``"tasks"``; ``None`` looks for none);
an unknown key is a :class:`~foundry.errors.ConfigError` naming it and the closest valid
one. See ``docs/integrations.md``.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from foundry.app import Foundry
from foundry.errors import ConfigError, SubmitError
from foundry.serialize import get_codec
from foundry.typed import payloads_for

__all__ = ["KEYS", "app_from_settings", "get_app", "on_commit", "submit_on_commit"]

KEYS = ("name", "home", "queue", "stream", "journal", "pool", "cluster", "watchdog", "tracing", "tasks")

_lock = threading.Lock()
_app: Foundry | None = None


def app_from_settings(config: Mapping[str, Any]) -> Foundry:
    """A new :class:`~foundry.Foundry` from a ``FOUNDRY`` settings mapping."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"settings.FOUNDRY is a {type(config).__name__}, not a dict. Fix: FOUNDRY = "
            '{"queue": "postgresql://…"} (or leave it out for the embedded default)'
        )
    for key in config:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"settings.FOUNDRY: unknown key {key!r}. Fix: {hint}the keys are {', '.join(KEYS)}"
            )
    options = {k: v for k, v in config.items() if k != "tasks"}
    return Foundry(options.pop("name", "django"), **options)


def get_app() -> Foundry:
    """The project's app, made once per process from ``settings.FOUNDRY`` (and closed at
    exit): declare units on it in the ``tasks`` modules."""
    global _app
    with _lock:
        if _app is None:
            from django.conf import settings

            _app = app_from_settings(getattr(settings, "FOUNDRY", {}))
            atexit.register(_app.close)
        return _app


def tasks_module() -> str | None:
    """The module name looked for in each installed app (``FOUNDRY["tasks"]``)."""
    from django.conf import settings

    name = getattr(settings, "FOUNDRY", {}).get("tasks", "tasks")
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise ConfigError(
            f'settings.FOUNDRY["tasks"]: {name!r} is not a module name. Fix: "tasks" (the default), '
            "another module name, or None to import none"
        )
    return name


def on_commit(*, using: str | None = None, robust: bool = False) -> Callable[..., None]:
    """A :func:`submit_on_commit` for database ``using`` (``robust``: an error of the
    submit is logged by Django instead of raised where the transaction committed)."""

    def submit(unit: Any, /, *args: Any, **kwargs: Any) -> None:
        from django.db import transaction

        start = getattr(unit, "submit", None) or getattr(unit, "enqueue", None)
        if not callable(start):
            raise SubmitError(
                f"submit_on_commit: {unit!r} has no submit(). Fix: pass a unit (@app.work), "
                "unit.options(...), or a workflow (it is enqueued for the workflow workers)"
            )
        transaction.on_commit(_deferred(start, unit, args, kwargs), using=using, robust=robust)

    return submit


submit_on_commit = on_commit()
"""``submit_on_commit(unit, *args, **kwargs)``: submit when the current transaction of the
default database commits — never if it rolls back; at once outside a transaction. The
arguments are encoded now (a bad one raises here, before anything commits; a later change
to them is not seen) and submitted after the commit. Returns ``None``: the handle does
not exist before the commit (give ``unit.options(key=...)`` to find the job later)."""


def _deferred(
    start: Callable[..., Any], unit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], None]:
    """The submit to run after the commit, on the arguments as they are now (encoded with
    the unit's codec: what cannot be encoded fails here, before the commit)."""
    bound = getattr(unit, "_unit", None)  # unit.options(...): the unit its options are bound to
    spec = getattr(unit, "spec", None) or getattr(bound, "spec", None)
    if spec is None:
        return functools.partial(start, *args, **kwargs)
    codec = get_codec(spec.traits.codec)
    types = payloads_for(spec.name, spec.fn)  # typed arguments: checked now, rebuilt at the submit
    typed = codec.name == "json"
    args_data, kwargs_data = types.dump_call(args, kwargs, convert=typed)
    data = codec.encode({"args": args_data, "kwargs": kwargs_data}, unit=spec.name, what="arguments")

    def submit() -> None:
        call = codec.decode(data)
        now_args, now_kwargs = call["args"], call["kwargs"]
        if typed:
            now_args, now_kwargs = types.load_call(
                now_args, now_kwargs, what="the arguments held for the commit"
            )
        start(*now_args, **now_kwargs)

    return submit


def _setup() -> Foundry:
    import django
    from django.apps import apps

    if not apps.ready:
        if not os.environ.get("DJANGO_SETTINGS_MODULE"):
            from django.conf import settings

            if not settings.configured:
                raise ConfigError(
                    "foundry.integrations.django:app needs Django's settings. Fix: set "
                    "DJANGO_SETTINGS_MODULE=mysite.settings (the project's settings module)"
                )
        django.setup()
    return get_app()


def __getattr__(name: str) -> Any:
    if name == "app":  # `foundry run foundry.integrations.django:app`
        return _setup()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
