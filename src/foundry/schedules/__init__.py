"""Schedules: cron expressions and fixed intervals declared on a unit.

``@app.work(schedule="*/5 * * * *", tz="Europe/Berlin")`` or ``schedule="every 30s"``
(:mod:`foundry.schedules.schedule`: spellings, validation, the missed-tick policy;
:mod:`foundry.schedules.cron`: the expression and daylight-saving rules). ``foundry run``
enqueues each tick's job (``foundry.deliver.scheduler``): exactly one per tick however
many run, on every queue engine. See ``docs/production.md``.
"""

from foundry.schedules.cron import Cron
from foundry.schedules.schedule import FIELDS, MAX_CATCH_UP, ON_TIME, Due, Schedule, split_schedule

__all__ = ["FIELDS", "MAX_CATCH_UP", "ON_TIME", "Cron", "Due", "Schedule", "split_schedule"]
