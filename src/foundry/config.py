"""Where state lives: backend URLs from arguments, ``FOUNDRY_*`` env, or ``foundry.toml``.

Precedence: explicit argument > environment (``FOUNDRY_QUEUE``, ``FOUNDRY_STREAM``,
``FOUNDRY_JOURNAL``, ``FOUNDRY_HOME``) > ``foundry.toml`` in the working directory
(``[foundry] queue = "redis://..."``) > the embedded default (SQLite files under
``home``, ``./.foundry`` unless told otherwise). ``rediss://`` and ``amqps://`` are the
TLS forms of ``redis://`` and ``amqp://`` (options: ``foundry.backends._urls``).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundry.errors import ConfigError

__all__ = ["SCHEMES", "Settings", "load_settings"]

SCHEMES: dict[str, tuple[str, ...]] = {
    "queue": ("sqlite", "redis", "rediss", "amqp", "amqps", "postgresql", "postgres", "memory"),
    "stream": ("sqlite", "nats", "redis", "rediss", "memory"),
    "journal": ("sqlite", "postgresql", "postgres", "memory"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    queue: str
    stream: str
    journal: str


def _from_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}). Fix: correct the file") from exc
    section = data.get("foundry", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [foundry] must be a table. Fix: write `[foundry]` on its own line")
    return section


def check_url(kind: str, url: str) -> str:
    """Validate ``url`` for a backend ``kind``; a typo gets a clear error, not a hang."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    allowed = SCHEMES[kind]
    if scheme not in allowed:
        import difflib

        close = difflib.get_close_matches(scheme, allowed, n=1)
        hint = f"did you mean {close[0]}://? " if close else ""
        raise ConfigError(
            f"{kind} backend URL {url!r} has scheme {scheme or '(none)'!r}, which Foundry does "
            f"not know. Fix: {hint}use one of {', '.join(s + '://' for s in allowed)}"
        )
    return url


def load_settings(
    home: str | os.PathLike[str] | None = None,
    *,
    queue: str | None = None,
    stream: str | None = None,
    journal: str | None = None,
    cwd: Path | None = None,
) -> Settings:
    base = cwd or Path.cwd()
    file = _from_toml(base / "foundry.toml")
    env = os.environ
    home_path = Path(home or env.get("FOUNDRY_HOME") or file.get("home") or base / ".foundry")

    def pick(kind: str, given: str | None, default: str) -> str:
        value = given or env.get(f"FOUNDRY_{kind.upper()}") or file.get(kind) or default
        if not isinstance(value, str):
            raise ConfigError(f"{kind} backend must be a URL string, got {value!r}")
        return check_url(kind, value)

    return Settings(
        home=home_path,
        queue=pick("queue", queue, f"sqlite:///{home_path / 'queue.db'}"),
        stream=pick("stream", stream, f"sqlite:///{home_path / 'stream.db'}"),
        journal=pick("journal", journal, f"sqlite:///{home_path / 'journal.db'}"),
    )
