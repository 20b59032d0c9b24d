"""What the broker engines' URLs share: masking a password for messages
(:func:`foundry.config.safe_url`, re-exported here), and TLS.

TLS is chosen by the scheme (``rediss://``, ``amqps://``); a few query options tune it
and are passed to the driver unchanged, each checked here first so a typo or a missing
file is a :class:`~foundry.errors.ConfigError` naming the option, not a failed
handshake later:

=========================  ==================================  ===============================
redis-py (``rediss://``)   aiormq (``amqps://``)               meaning
=========================  ==================================  ===============================
``ssl_ca_certs=<file>``    ``cafile=<file>``                   PEM file of the CA(s) to trust
``ssl_certfile=<file>``    ``certfile=<file>``                 client certificate (mutual TLS)
``ssl_keyfile=<file>``     ``keyfile=<file>``                  its private key
``ssl_cert_reqs=none``     ``no_verify_ssl=1``                 do not verify the server (tests)
``ssl_check_hostname=``                                        ``false``: skip the host name check
=========================  ==================================  ===============================

Without a CA option the system's trust store is used. A certificate the client refuses
is a :class:`~foundry.errors.ConfigError` at once (:func:`refused_certificate`):
retrying cannot fix it.
"""

from __future__ import annotations

import math
import os
import ssl
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qs, urlsplit

from foundry.config import safe_url  # re-exported: the engines import it from here
from foundry.errors import ConfigError

__all__ = [
    "AMQP_TLS",
    "REDIS_PASSED",
    "REDIS_TLS",
    "TLS_SCHEMES",
    "ShowsUrl",
    "query_options",
    "refused_certificate",
    "safe_url",
    "seconds_option",
    "tls_options",
    "url_options",
]


class ShowsUrl:
    """What a backend says about its URL: ``url`` is the masked form (:func:`safe_url`),
    for messages, logs, tools and ``repr``; the URL with its password stays in ``_url``,
    for the driver only."""

    _url: str

    @property
    def url(self) -> str:
        """The store's URL with its secrets masked."""
        return safe_url(self._url)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


# The redis-py connection options a Redis URL of Foundry's may carry besides TLS.
def query_options(url: str) -> dict[str, str]:
    """A URL's query options, the last one winning when an option is given twice."""
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query, keep_blank_values=True).items()}


def url_options(family: str, url: str, *allowed: Iterable[str]) -> dict[str, str]:
    """``url``'s query options (:func:`query_options`), refusing one outside ``allowed``
    (the engine's own, those it passes to its driver, its TLS ones) with the whole list."""
    query = query_options(url)
    known = [name for names in allowed for name in names]
    unknown = sorted(k for k in query if k not in known)
    if unknown:
        raise ConfigError(
            f"{family} URL {safe_url(url)!r}: unknown option(s) {', '.join(unknown)}. "
            f"Fix: use only {', '.join(known)}"
        )
    return query


def seconds_option(family: str, url: str, query: Mapping[str, str], name: str, default: float) -> float:
    """The positive number option ``name`` of ``family``'s ``url`` (``8``, ``8s``, ``250ms``);
    ``default`` when absent, a :class:`ConfigError` naming the option when not positive."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw[:-2]) / 1000 if raw.endswith("ms") else float(raw.rstrip("s"))
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{family} URL {safe_url(url)!r}: {name}={raw!r} is not a positive number. Fix: e.g. {name}=8"
        )
    return value


REDIS_PASSED = ("socket_timeout", "socket_connect_timeout", "health_check_interval", "client_name")
_FILE = "file"
# option -> _FILE, or the values it accepts
REDIS_TLS: dict[str, str | tuple[str, ...]] = {
    "ssl_ca_certs": _FILE,
    "ssl_certfile": _FILE,
    "ssl_keyfile": _FILE,
    "ssl_cert_reqs": ("none", "optional", "required"),
    "ssl_check_hostname": ("true", "false"),
}
AMQP_TLS: dict[str, str | tuple[str, ...]] = {
    "cafile": _FILE,
    "certfile": _FILE,
    "keyfile": _FILE,
    "no_verify_ssl": ("0", "1"),
}
_KEY_NEEDS = {"ssl_keyfile": "ssl_certfile", "keyfile": "certfile"}
TLS_SCHEMES = {"rediss": "redis", "amqps": "amqp"}  # TLS scheme -> the plain one


def tls_options(
    what: str, url: str, query: Mapping[str, str], options: Mapping[str, str | tuple[str, ...]]
) -> dict[str, str]:
    """The TLS options ``options`` of ``query`` (the query of ``url``, a ``what`` URL
    such as "queue"), checked: only on a TLS scheme, files that exist, known values."""
    found = {name: value for name, value in query.items() if name in options}
    if not found:
        return found
    shown = safe_url(url)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in TLS_SCHEMES:
        raise ConfigError(
            f"{what} URL {shown!r}: {', '.join(sorted(found))} only apply to TLS, and {scheme}:// is "
            f"plain TCP. Fix: use {scheme}s:// to connect with TLS, or drop the option"
        )
    for name, value in found.items():
        accepted = options[name]
        if accepted == _FILE:
            if not os.path.isfile(value):
                raise ConfigError(
                    f"{what} URL {shown!r}: {name}={value!r} is not a file. Fix: the absolute path of "
                    "a PEM file this process can read (percent-encode it if it has & or #)"
                )
        elif value not in accepted:
            raise ConfigError(
                f"{what} URL {shown!r}: {name}={value!r} is not one of {', '.join(accepted)}. "
                f"Fix: e.g. {name}={accepted[0]}"
            )
    for key, cert in _KEY_NEEDS.items():
        if key in found and cert not in found:
            raise ConfigError(
                f"{what} URL {shown!r}: {key} without {cert}. Fix: give the client certificate as "
                f"{cert}=<file> too (or drop {key} when the certificate file holds the key)"
            )
    return found


def refused_certificate(exc: BaseException, what: str, url: str, ca_option: str) -> ConfigError | None:
    """A :class:`ConfigError` saying what to fix when ``exc`` (or an error it was
    raised from) is the client refusing the server's TLS certificate; else ``None``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            reason = cur.verify_message or str(cur)
            return ConfigError(
                f"{what} URL {safe_url(url)!r}: the server's TLS certificate was refused ({reason}). "
                f"Fix: set {ca_option}=<PEM file of the CA that signed the server's certificate>, and "
                "connect by the host name (or IP) the certificate names"
            )
        cur = cur.__cause__ or cur.__context__
    return None
