"""Where state lives: backend URLs from arguments, ``FOUNDRY_*`` env, or ``foundry.toml``.

Precedence: explicit argument > environment (``FOUNDRY_QUEUE``, ``FOUNDRY_STREAM``,
``FOUNDRY_JOURNAL``, ``FOUNDRY_HOME``) > ``foundry.toml`` in the working directory
(``[foundry] queue = "redis://..."``) > the embedded default (SQLite files under
``home``, ``./.foundry`` unless told otherwise). ``rediss://`` and ``amqps://`` are the
TLS forms of ``redis://`` and ``amqp://`` (options: ``foundry.backends._urls``).

A URL may carry a password (``postgresql://app:secret@db/app``); Foundry connects with
it but never shows it: every message, log line and ``repr`` prints :func:`safe_url`'s
form (``postgresql://app:***@db/app``).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from foundry.errors import ConfigError

__all__ = ["SCHEMES", "Settings", "load_settings", "safe_url"]

SCHEMES: dict[str, tuple[str, ...]] = {
    "queue": ("sqlite", "redis", "rediss", "amqp", "amqps", "postgresql", "postgres", "memory"),
    "stream": ("sqlite", "nats", "redis", "rediss", "memory"),
    "journal": ("sqlite", "postgresql", "postgres", "memory"),
}


# Query options whose value is a secret (libpq's password= and sslpassword=, tokens).
_SECRET_OPTIONS = ("password", "secret", "token")
# Schemes whose user part alone is a secret (NATS token auth: nats://<token>@host).
_TOKEN_SCHEMES = ("nats", "tls")


def safe_url(url: str) -> str:
    """``url`` with its secrets masked, for messages, log lines and reprs: the password of
    each ``user:password@`` (every host of ``nats://u:p@a,u:p@b``), a NATS token
    (``nats://token@host``) and query options such as ``password=``. Never raises, and
    ``safe_url(safe_url(url)) == safe_url(url)``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    # The authority ends at /, ? or # -- but a ? or # before its last @ is in the password.
    slash = rest.find("/") if "/" in rest else len(rest)
    start = rest.rfind("@", 0, slash) + 1
    end = min((i for i in (rest.find(c, start) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        token = scheme.lower() in _TOKEN_SCHEMES
        *users, hosts = authority.split("@")
        shown: list[str] = []
        for i, user in enumerate(users):
            if i:
                if "," not in user:  # an unencoded @ inside the password: still the secret
                    continue
                host, user = user.split(",", 1)
                shown.append(f"@{host},")
            name, colon, _ = user.partition(":")
            shown.append(f"{name}:***" if colon else "***" if token else name)
        authority = "".join(shown) + "@" + hosts
    path, qmark, query = tail.partition("?")
    if qmark:
        query = "&".join(_safe_option(pair) for pair in query.split("&"))
    return f"{scheme}://{authority}{path}{qmark}{query}"


def _safe_option(pair: str) -> str:
    """One ``name=value`` of a URL's query, its value masked if it is a secret or a URL
    with one (the AMQP queue's ``state=postgresql://user:password@…``, also encoded)."""
    name, eq, value = pair.partition("=")
    if eq and any(word in name.lower() for word in _SECRET_OPTIONS):
        return f"{name}=***"
    inner = unquote(value)
    if "://" in inner and safe_url(inner) != inner:
        return f"{name}={safe_url(inner)}"
    return pair


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
            f"{kind} backend URL {safe_url(url)!r} has scheme {scheme or '(none)'!r}, which Foundry does "
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
