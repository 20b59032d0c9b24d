"""`foundry lab`: capacity answers before production gives them.

    foundry lab pool    --workers 8 --service 50ms --rate 120/s   M/M/c, G/G/c, simulation
    foundry lab permits [--sim]                                   goodput vs permits
    foundry lab server  --concurrency 200 --cpu 2ms --wait 48ms   thread/request vs pool vs async
    foundry lab loop    --cpu 35ms --rate 300/s --budget 100ms    loop-starvation schedule
    foundry lab fit     --csv times.csv --rate 120/s --target 100ms   sizes from measurements

Every subcommand prints rich tables, or ``--json``, and draws ``--plot FILE.png|.svg``.
Every number is labelled with the method that produced it. Bad input exits 2 (syntax,
from argparse) or 1 (a :class:`~foundry.errors.LabInputError` naming field and fix).

One module per model registers its own subcommand and runs it; this one only wires them
under ``lab``, in the order ``foundry lab --help`` lists them.
"""

from __future__ import annotations

import argparse
from typing import Any

from foundry.cli.lab import fit, loop, permits, pool, server

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    lab: argparse.ArgumentParser = sub.add_parser(
        "lab", help="queueing models and simulation: pool sizing, permits, server models, loop starvation"
    )
    labsub = lab.add_subparsers(dest="lab_command", metavar="MODEL")

    def show_help(args: argparse.Namespace) -> int:
        lab.print_help()
        return 2

    lab.set_defaults(func=show_help)
    for model in (pool, permits, server, loop, fit):
        model.add_parser(labsub)
