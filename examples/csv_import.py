"""Seed 003's CSV import: the 40-line file runs sequentially (and Foundry says why); a
generated 1,000,000-line file runs on the parallel model, measured against a plain loop.

    python examples/csv_import.py              # about 20 s on 2 cores
    python examples/csv_import.py --rows 100000 --json

The code is foundry/examples/csv_import.py (importable: the parallel workers import it).
"""

from foundry.examples.csv_import import main

if __name__ == "__main__":
    raise SystemExit(main())
