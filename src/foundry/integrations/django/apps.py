"""The ``AppConfig`` of ``"foundry.integrations.django"`` in ``INSTALLED_APPS``: it makes the
project's app from ``settings.FOUNDRY`` when Django starts (a bad setting fails there,
naming the key) and imports every installed app's ``tasks`` module, where units are
declared — so a worker started on ``foundry.integrations.django:app`` knows them all."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

from django.apps import AppConfig, apps

from foundry.integrations.django import get_app, tasks_module


class FoundryConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    name = "foundry.integrations.django"
    label = "foundry"
    verbose_name = "Foundry"

    def ready(self) -> None:
        get_app()
        module = tasks_module()
        if module is None:
            return
        for config in apps.get_app_configs():
            if config.name == self.name:
                continue
            target = f"{config.name}.{module}"
            try:
                found = find_spec(target)
            except ModuleNotFoundError:  # the app is a module, not a package: it has no tasks
                found = None
            if found is not None:
                import_module(target)
