"""Where state lives: backend URLs from arguments, ``FOUNDRY_*`` env, or a config file.

Precedence: explicit argument > environment (``FOUNDRY_QUEUE``, ``FOUNDRY_STREAM``,
``FOUNDRY_JOURNAL``, ``FOUNDRY_POOL``, ``FOUNDRY_CLUSTER``, ``FOUNDRY_HOME``,
``FOUNDRY_WATCHDOG``) > the nearest ``foundry.toml`` (``[foundry]``) or ``pyproject.toml``
(``[tool.foundry]``) at or above the working directory (``queue = "redis://..."``,
``watchdog = false``) > the embedded default: SQLite files under ``home``, which is
``.foundry`` next to the nearest ``foundry.toml``/``pyproject.toml`` (the project's root),
or ``./.foundry`` outside any project, and the loop watchdog on at 100 ms.
:func:`load_settings` decides it, once. A setting Foundry does not know is an error
naming the closest one it does, wherever it was written: a key of ``[foundry]`` /
``[tool.foundry]``, a ``FOUNDRY_*`` variable close to one of :data:`KNOWN_ENV`, a
keyword argument of ``Foundry(...)``.
``rediss://`` and ``amqps://`` are the TLS forms of ``redis://`` and ``amqp://``
(options: ``foundry.backends._urls``).
``cluster`` is where ``parallel`` computes its chunks: ``local://`` (this machine's
processes, the default), a Dask scheduler (``tcp://host:8786``) or Ray (``ray://head:10001``).

A URL may carry a password (``postgresql://app:secret@db/app``); Foundry connects with
it but never shows it: every message, log line and ``repr`` prints :func:`safe_url`'s
form (``postgresql://app:***@db/app``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from foundry._suggest import closest
from foundry.errors import ConfigError, DeclarationError
from foundry.traits import parse_duration

__all__ = [
    "DEFAULT_WATCHDOG",
    "KNOWN_ENV",
    "KNOWN_KEYS",
    "SCHEMES",
    "Settings",
    "check_environment",
    "load_settings",
    "parse_watchdog",
    "resolve_home",
    "safe_url",
    "sqlite_path",
    "unknown_argument_error",
    "watchdog_setting",
]

DEFAULT_WATCHDOG = 0.1
"""Seconds a Foundry-run event loop may be held before the watchdog reports it."""
_OFF = frozenset({"0", "off", "false", "no", "none"})
_ON = frozenset({"1", "on", "true", "yes"})

SCHEMES: dict[str, tuple[str, ...]] = {
    "queue": ("sqlite", "redis", "rediss", "amqp", "amqps", "postgresql", "postgres", "memory"),
    "stream": ("sqlite", "nats", "redis", "rediss", "memory"),
    "journal": ("sqlite", "postgresql", "postgres", "memory"),
    "pool": ("local", "nats", "tls"),
    "cluster": ("local", "tcp", "dask", "ray"),
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


KNOWN_KEYS: tuple[str, ...] = ("home", "queue", "stream", "journal", "pool", "cluster", "watchdog")
"""The keys of ``[foundry]`` in ``foundry.toml`` (``[tool.foundry]`` in ``pyproject.toml``)."""

KNOWN_ENV: tuple[str, ...] = (
    *(f"FOUNDRY_{key.upper()}" for key in KNOWN_KEYS),
    "FOUNDRY_DASHBOARD_TOKEN",  # foundry dashboard: the token its actions require
    "FOUNDRY_FLEET",  # the fleet registry a worker announces itself in (foundry.observe.fleet)
    "FOUNDRY_FLEET_INTERVAL",  # ... and how often
    "FOUNDRY_EXAMPLE_RSA_KEY",  # foundry.examples.payments: the signing key its server processes share
    "FOUNDRY_TRACING",  # on | off | auto: OpenTelemetry (foundry.observe.tracing)
)
"""Every environment variable Foundry reads. A new one is added here, or
:func:`check_environment` may take it for a misspelling of one of these (a test checks
that every ``FOUNDRY_*`` name in the source is listed)."""


@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Where one app's state lives: ``home`` (the embedded stores' directory) and the
    three backend URLs, with ``source`` saying how ``home`` was chosen. Its ``repr`` and
    :meth:`describe` show the URLs masked (:func:`safe_url`)."""

    home: Path
    queue: str
    stream: str
    journal: str
    pool: str = "local://"
    cluster: str = "local://"
    source: str = "given"
    config_file: Path | None = None
    watchdog: float | None = DEFAULT_WATCHDOG
    """The loop watchdog's threshold in seconds on every loop Foundry runs; ``None``: off."""

    def describe(self, *kinds: str) -> str:
        """One line for people: the URLs of ``kinds`` (default all of them), masked, and the
        home with where it came from."""
        urls = ", ".join(f"{kind} {safe_url(getattr(self, kind))}" for kind in kinds or SCHEMES)
        return f"{urls} (home {self.home}, from {self.source})"

    def __repr__(self) -> str:
        return (
            f"Settings(home={str(self.home)!r}, queue={safe_url(self.queue)!r}, "
            f"stream={safe_url(self.stream)!r}, journal={safe_url(self.journal)!r}, "
            f"pool={safe_url(self.pool)!r}, cluster={safe_url(self.cluster)!r}, source={self.source!r}, "
            f"watchdog={self.watchdog!r})"
        )


def parse_watchdog(value: object, where: str = "watchdog") -> float | None:
    """The watchdog setting: ``True``/``"on"`` (the 100 ms default), ``False``/``"off"``/``0``
    (no watchdog, no loop-lag monitor), or a threshold (``"50ms"``, ``0.25``)."""
    if isinstance(value, bool):
        return DEFAULT_WATCHDOG if value else None
    if isinstance(value, str) and value.strip().lower() in _OFF | _ON:
        return DEFAULT_WATCHDOG if value.strip().lower() in _ON else None
    try:
        seconds = parse_duration(value, unit=where, field_name="watchdog")  # type: ignore[arg-type]
    except DeclarationError as exc:
        raise ConfigError(
            f"{where}: {value!r} is not a watchdog setting. Fix: watchdog = false (off), true (on, "
            f'{DEFAULT_WATCHDOG * 1e3:.0f} ms) or a threshold such as "50ms"'
        ) from exc
    return seconds or None


@dataclass(frozen=True, slots=True)
class _Project:
    """The nearest configuration above the working directory."""

    root: Path  # the directory state goes next to (``<root>/.foundry``)
    file: Path | None  # the file that configures Foundry (None: a pyproject.toml without it)
    section: dict[str, Any]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}). Fix: correct the file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc}). Fix: check its permissions") from exc


def _section(path: Path, data: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``where`` table of ``data`` (``foundry`` or ``tool.foundry``), its keys checked."""
    section: Any = data
    for part in where.split("."):
        section = section.get(part, {}) if isinstance(section, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [{where}] must be a table. Fix: write `[{where}]` on its own line")
    for key in section:
        if key not in KNOWN_KEYS:
            raise unknown_argument_error(f"{path}: [{where}]", str(key), KNOWN_KEYS, what="key")
    return section


def unknown_argument_error(
    where: str, key: str, known: Sequence[str], *, what: str = "argument"
) -> ConfigError:
    """The error for a setting Foundry does not know (``where`` has the ``what`` ``key``),
    naming the closest known one (:func:`foundry._suggest.closest`) and all of them."""
    near = closest(key, known)
    hint = f"did you mean {near!r}? " if near else ""
    return ConfigError(
        f"{where} has the {what} {key!r}, which Foundry does not know. Fix: {hint}the {what}s are "
        f"{', '.join(known)}"
    )


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Refuse a ``FOUNDRY_*`` variable that is a misspelt Foundry setting
    (``FOUNDRY_QUEUES``, ``FOUNDRY_JOURNEL``, ``FOUNDRY_QUEUE_URL``) with a
    :class:`ConfigError` naming the one meant (:data:`KNOWN_ENV`).

    Only a *near miss* is refused. The ``FOUNDRY_`` prefix is not Foundry's alone: Forge,
    the Ethereum toolchain also called Foundry, reads ``FOUNDRY_PROFILE``,
    ``FOUNDRY_ETH_RPC_URL`` and dozens more from the same environment, and a test suite
    or a deployment may keep its own (``FOUNDRY_TEST_REDIS``); refusing every unknown name
    would make Foundry unusable beside them, while a name close to none of Foundry's
    cannot have been meant for it."""
    names = {name.removeprefix("FOUNDRY_").lower(): name for name in KNOWN_ENV}
    for var in os.environ if env is None else env:
        if not var.startswith("FOUNDRY_") or var in KNOWN_ENV:
            continue
        near = closest(var.removeprefix("FOUNDRY_").lower(), names, cutoff=0.8)
        if near is not None:
            raise ConfigError(
                f"the environment variable {var} is not a Foundry setting. Fix: did you mean "
                f"{names[near]}? rename it (the settings are {', '.join(KNOWN_ENV)})"
            )


def _find_project(start: Path) -> _Project | None:
    """Walk up from ``start``: the first directory with a ``foundry.toml`` or a
    ``pyproject.toml`` that has ``[tool.foundry]`` configures Foundry; without one, the
    nearest ``pyproject.toml`` still marks the project's root."""
    root: Path | None = None
    for folder in (start, *start.parents):
        file = folder / "foundry.toml"
        pyproject = folder / "pyproject.toml"
        tool: dict[str, Any] | None = None
        if pyproject.is_file():
            data = _read_toml(pyproject)
            if isinstance(data.get("tool"), dict) and "foundry" in data["tool"]:
                tool = _section(pyproject, data, "tool.foundry")
            elif root is None:
                root = folder
        if file.is_file():
            if tool is not None:
                raise ConfigError(
                    f"{folder} configures Foundry twice: in foundry.toml and in [tool.foundry] of "
                    "pyproject.toml. Fix: keep one of them"
                )
            return _Project(folder, file, _section(file, _read_toml(file), "foundry"))
        if tool is not None:
            return _Project(folder, pyproject, tool)
    return None if root is None else _Project(root, None, {})


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:///`` URL names: relative (``sqlite:///q.db``), or absolute
    with four slashes (``sqlite:////var/lib/q.db``); ``""`` when it names none."""
    raw = url.split("?", 1)[0][len("sqlite://") :]
    return raw[1:] if raw.startswith("/") else raw


def _relative_to(folder: Path, url: str) -> str:
    """A ``sqlite:///relative.db`` URL from a config file names a file next to it."""
    if url.lower().startswith("sqlite:///") and not url.lower().startswith("sqlite:////"):
        rest = url[len("sqlite:///") :]
        if rest and not rest.startswith(("?", ":memory:")):
            return f"sqlite:///{folder / rest}"
    return url


def resolve_home(home: str | os.PathLike[str] | None = None, *, cwd: Path | None = None) -> Path:
    """The state directory, decided in one place: ``home`` if given, else
    ``FOUNDRY_HOME``, else ``home =`` of the nearest ``foundry.toml`` / ``[tool.foundry]``,
    else ``.foundry`` next to the nearest ``foundry.toml`` or ``pyproject.toml``, else
    ``./.foundry``. Always absolute."""
    base = (cwd or Path.cwd()).absolute()
    return _home(home, base, _find_project(base))[0]


def _home(home: str | os.PathLike[str] | None, base: Path, project: _Project | None) -> tuple[Path, str]:
    """(the state directory, where that came from)."""
    env = os.environ
    file = project.section if project is not None else {}
    if home:
        path, source = Path(home), "Foundry(home=...)"
    elif env.get("FOUNDRY_HOME"):
        path, source = Path(env["FOUNDRY_HOME"]), "FOUNDRY_HOME"
    elif project is not None and file.get("home"):
        value = file["home"]
        if not isinstance(value, str):
            raise ConfigError(f"{project.file}: home must be a path string, got {value!r}")
        path, source = project.root / value, f"home in {project.file}"
    elif project is not None:
        marker = project.file or project.root / "pyproject.toml"
        path, source = project.root / ".foundry", f"the project at {marker}"
    else:
        path, source = base / ".foundry", "the working directory (no foundry.toml or pyproject.toml above)"
    return (path if path.is_absolute() else base / path), source


def _watchdog_of(env: Mapping[str, str], project: _Project | None) -> float | None:
    """``FOUNDRY_WATCHDOG``, else ``watchdog =`` of the nearest configuration file, else on."""
    if "FOUNDRY_WATCHDOG" in env:
        return parse_watchdog(env["FOUNDRY_WATCHDOG"], "FOUNDRY_WATCHDOG")
    if project is not None and "watchdog" in project.section:
        return parse_watchdog(project.section["watchdog"], f"{project.file}: watchdog")
    return DEFAULT_WATCHDOG


def watchdog_setting(cwd: Path | None = None) -> float | None:
    """The process's watchdog setting without an app: ``FOUNDRY_WATCHDOG``, then
    ``watchdog =`` in the nearest ``foundry.toml`` / ``[tool.foundry]`` at or above the
    working directory, then on (100 ms)."""
    check_environment()
    return _watchdog_of(os.environ, _find_project((cwd or Path.cwd()).absolute()))


def check_url(kind: str, url: str) -> str:
    """Validate ``url`` for a backend ``kind``; a typo gets a clear error, not a hang."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    allowed = SCHEMES[kind]
    if scheme not in allowed:
        near = closest(scheme, allowed)
        hint = f"did you mean {near}://? " if near else ""
        raise ConfigError(
            f"{kind} backend URL {safe_url(url)!r} has scheme {scheme or '(none)'!r}, which Foundry does "
            f"not know. Fix: {hint}use one of {', '.join(s + '://' for s in allowed)}"
        )
    if kind == "pool" and scheme == "local" and url.split("://", 1)[1].rstrip("/") not in ("", "served"):
        raise ConfigError(
            f"pool URL {url!r}: the embedded pool is local:// (workers started by the app) or local://served "
            "(workers started by `foundry pool serve` on this machine). Fix: use one of those"
        )
    return url


def load_settings(
    home: str | os.PathLike[str] | None = None,
    *,
    queue: str | None = None,
    stream: str | None = None,
    journal: str | None = None,
    pool: str | None = None,
    cluster: str | None = None,
    watchdog: bool | float | str | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Resolve where state lives, once (``docs/queue.md`` "Where state lives").

    ``home``: the argument (``Foundry(home=...)``), else ``FOUNDRY_HOME``, else ``home =``
    in the nearest configuration file (relative to that file), else ``.foundry`` in the
    directory of the nearest ``foundry.toml`` or ``pyproject.toml`` above the working
    directory, else ``./.foundry``. So a submitter and a worker started from different
    directories of one project share one store.

    Each URL: the argument, else ``FOUNDRY_<KIND>``, else the configuration file (a
    relative ``sqlite:///`` path is relative to the file), else a SQLite file in ``home``.
    An unknown key in the configuration file, and a misspelt ``FOUNDRY_*`` variable
    (:func:`check_environment`), is a :class:`ConfigError` naming the closest known one.

    ``watchdog``: the argument (``Foundry(watchdog=...)``), else ``FOUNDRY_WATCHDOG``,
    else ``watchdog =`` in the configuration file, else on at 100 ms."""
    base = (cwd or Path.cwd()).absolute()
    env = os.environ
    check_environment(env)
    project = _find_project(base)
    file = project.section if project is not None else {}
    home_path, source = _home(home, base, project)

    def pick(kind: str, given: str | None, default: str) -> str:
        value: Any = given or env.get(f"FOUNDRY_{kind.upper()}")
        if not value and project is not None and file.get(kind):
            value = file[kind]
            if not isinstance(value, str):
                raise ConfigError(f"{project.file}: {kind} must be a URL string, got {value!r}")
            value = _relative_to(project.root, value)
        value = value or default
        if not isinstance(value, str):
            raise ConfigError(f"{kind} backend must be a URL string, got {value!r}")
        return check_url(kind, value)

    threshold = (
        parse_watchdog(watchdog, "Foundry(watchdog=...)")
        if watchdog is not None
        else _watchdog_of(env, project)
    )
    return Settings(
        home=home_path,
        queue=pick("queue", queue, f"sqlite:///{home_path / 'queue.db'}"),
        stream=pick("stream", stream, f"sqlite:///{home_path / 'stream.db'}"),
        journal=pick("journal", journal, f"sqlite:///{home_path / 'journal.db'}"),
        source=source,
        config_file=project.file if project is not None else None,
        pool=pick("pool", pool, "local://"),
        cluster=pick("cluster", cluster, "local://"),
        watchdog=threshold,
    )
