from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from foundry.cli import main


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run `foundry ARGS...` in-process; return (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def app_file(tmp_path: Path) -> Path:
    """A user's app.py with two units, one with a phase and one walking into an anti-pattern."""
    path = tmp_path / "myapp.py"
    path.write_text(
        "import asyncio\n"
        "from foundry import Foundry\n"
        "app = Foundry('mine')\n"
        "@app.work(est='40ms', bound='io', concurrency=300,\n"
        "          phases={'sign': {'est': '35ms', 'bound': 'cpu'}})\n"
        "async def handler(x):\n"
        "    await asyncio.sleep(0.001)\n"
        "    return x\n"
        "@app.work(durable=True, model='direct')\n"
        "def pay(x):\n"
        "    return x\n"
        "def nap(seconds=0.01):\n"
        "    import time; time.sleep(seconds); return seconds\n"
        "async def anap(seconds=0.01):\n"
        "    await asyncio.sleep(seconds); return seconds\n"
        "def burn(n=20000):\n"
        "    return sum(i * i for i in range(n))\n"
        "def boom():\n"
        "    raise RuntimeError('bad input\\nsecond line')\n"
    )
    return path
