"""No secrets in logs: a password in a backend URL reaches the driver, never a message.

Every engine whose URL can carry a password (PostgreSQL queue and journal, Redis queue
and stream, the RabbitMQ queue and its ``state=`` store, the NATS stream) is driven into
each way it can talk about its URL — a bad option (:class:`ConfigError`), a server that
is not there, a server that refuses the login, and the ``repr`` of an open backend —
with every log record captured at DEBUG. The password must appear in none of them:
not in an error's ``str`` or ``repr``, nor in any error it was raised from, nor in a
log line. The URL itself still shows, masked (``user:***@host``), so a message still
says which store it is about.

The refused-login cases need the real servers (``tests.services.require``); the others
use a closed port on 127.0.0.1 and need none.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from foundry.backends.journal import open_journal
from foundry.backends.queue import open_queue_backend
from foundry.backends.stream import open_stream_backend
from foundry.config import load_settings, safe_url
from foundry.errors import BackendUnavailableError, ConfigError, FoundryError
from tests.services import require

SECRET = "s3cr3t-XYZ"
MASKED = ":***@"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every error it was raised from or during."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not e for e in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _assert_hidden(caplog: pytest.LogCaptureFixture, *shown: object) -> None:
    """The password is in none of ``shown`` (errors with their chains, or objects'
    ``str``/``repr``) and in no log record captured so far."""
    for item in shown:
        items = _chain(item) if isinstance(item, BaseException) else [item]
        for obj in items:
            for text in (str(obj), repr(obj)):
                assert SECRET not in text, f"{type(obj).__name__} shows the password: {text}"
    for record in caplog.records:
        assert SECRET not in record.getMessage(), f"log {record.name}: {record.getMessage()}"
    assert SECRET not in caplog.text


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def port() -> int:
    """A port on 127.0.0.1 nothing listens on: connecting is refused at once."""
    return _free_port()


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """Backends a case opened; closed afterwards."""
    backends: list[Any] = []
    yield backends
    for backend in backends:
        backend.close()


def _pg(user: str, port: int | str = 5432, query: str = "") -> str:
    return f"postgresql://{user}:{SECRET}@127.0.0.1:{port}/test?connect_timeout=2{query}"


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(require("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- safe_url itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://app:{SECRET}@db:5432/app", "postgresql://app:***@db:5432/app"),
        (f"redis://:{SECRET}@h:6379/0?prefix=x", "redis://:***@h:6379/0?prefix=x"),
        (f"nats://u:{SECRET}@a:4222,u:{SECRET}@b:4222", "nats://u:***@a:4222,u:***@b:4222"),
        (f"nats://{SECRET}@h:4222", "nats://***@h:4222"),
        (f"amqp://g:p@{SECRET}@h/", "amqp://g:***@h/"),
        (f"amqp://g:{SECRET}#x@h/v", "amqp://g:***@h/v"),
        (
            f"postgresql://h/d?password={SECRET}&sslpassword={SECRET}",
            "postgresql://h/d?password=***&sslpassword=***",
        ),
        (
            f"amqp://h/?state={quote(f'postgresql://u:{SECRET}@h/d', safe='')}",
            "amqp://h/?state=postgresql://u:***@h/d",
        ),
        ("postgresql://app@db/app?schema=s", "postgresql://app@db/app?schema=s"),
        ("sqlite:///q.db", "sqlite:///q.db"),
        ("not a url", "not a url"),
    ],
)
def test_safe_url_masks_every_secret(url: str, shown: str) -> None:
    assert safe_url(url) == shown
    assert safe_url(shown) == shown


# -- a bad option: ConfigError before any connection ------------------------------------

_ST_BAD_SCHEME = quote(f"mysql://app:{SECRET}@127.0.0.1/db", safe="")
_ST_BAD_OPTION = quote(f"postgresql://app:{SECRET}@127.0.0.1/test?prefix=1bad", safe="")
CONFIG_CASES: dict[str, Callable[[Path], Any]] = {
    "postgres-queue": lambda _: open_queue_backend(f"postgresql://app:{SECRET}@127.0.0.1/test?prefix=1bad"),
    "postgres-queue-schema": lambda _: open_queue_backend(
        f"postgresql://app:{SECRET}@127.0.0.1/t?schema=a-b"
    ),
    "postgres-journal": lambda _: open_journal(f"postgresql://app:{SECRET}@127.0.0.1/test?pool=0"),
    "redis-queue": lambda _: open_queue_backend(f"redis://app:{SECRET}@127.0.0.1/0?bogus=1"),
    "redis-queue-timeout": lambda _: open_queue_backend(f"redis://app:{SECRET}@127.0.0.1/0?reconnect=-1"),
    "redis-stream": lambda _: open_stream_backend(f"redis://app:{SECRET}@127.0.0.1/0?bogus=1"),
    "amqp-queue": lambda _: open_queue_backend(f"amqp://app:{SECRET}@127.0.0.1/?bogus=1"),
    "amqp-state-scheme": lambda _: open_queue_backend(
        f"amqp://guest:guest@127.0.0.1/?state={_ST_BAD_SCHEME}"
    ),
    "amqp-state-option": lambda _: open_queue_backend(
        f"amqp://guest:guest@127.0.0.1/?state={_ST_BAD_OPTION}"
    ),
    "nats-stream": lambda _: open_stream_backend(f"nats://app:{SECRET}@127.0.0.1:4222?bogus=1"),
    "queue-scheme-typo": lambda _: open_queue_backend(f"postgress://app:{SECRET}@127.0.0.1/test"),
    "journal-scheme-typo": lambda _: open_journal(f"postgress://app:{SECRET}@127.0.0.1/test"),
    "stream-scheme-typo": lambda _: open_stream_backend(f"natss://app:{SECRET}@127.0.0.1:4222"),
    "settings-scheme-typo": lambda tmp: load_settings(tmp, queue=f"redis2://app:{SECRET}@h/0", cwd=tmp),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_a_bad_option_hides_the_password(
    case: str, tmp_path: Path, caplog_debug: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError) as info:
        CONFIG_CASES[case](tmp_path)
    assert MASKED in str(info.value), f"the message should still name the (masked) URL: {info.value}"
    _assert_hidden(caplog_debug, info.value)


# -- nothing listens: the driver's connection error ------------------------------------


def _pg_queue_down(port: int, _: list[Any]) -> None:
    open_queue_backend(_pg("app", port))


def _pg_journal_down(port: int, _: list[Any]) -> None:
    open_journal(_pg("app", port))


def _redis_queue_down(port: int, opened: list[Any]) -> None:
    opened.append(open_queue_backend(f"redis://app:{SECRET}@127.0.0.1:{port}/0?reconnect=0.2"))
    opened[-1].stats("default")


def _redis_stream_down(port: int, opened: list[Any]) -> None:
    opened.append(open_stream_backend(f"redis://app:{SECRET}@127.0.0.1:{port}/0?socket_connect_timeout=1"))
    opened[-1].streams()


def _amqp_down(port: int, _: list[Any]) -> None:
    open_queue_backend(f"amqp://app:{SECRET}@127.0.0.1:{port}/?reconnect=0.5&state=memory://")


def _amqp_state_down(port: int, _: list[Any]) -> None:
    state = quote(_pg("app", port), safe="")
    open_queue_backend(f"amqp://guest:guest@127.0.0.1:{port}/?reconnect=0.5&state={state}")


def _nats_down(port: int, opened: list[Any]) -> None:
    opened.append(open_stream_backend(f"nats://app:{SECRET}@127.0.0.1:{port}"))
    opened[-1].streams()


DOWN_CASES: dict[str, Callable[[int, list[Any]], None]] = {
    "postgres-queue": _pg_queue_down,
    "postgres-journal": _pg_journal_down,
    "redis-queue": _redis_queue_down,
    "redis-stream": _redis_stream_down,
    "amqp-queue": _amqp_down,
    "amqp-state": _amqp_state_down,
    "nats-stream": _nats_down,
}


@pytest.mark.parametrize("case", sorted(DOWN_CASES))
def test_an_unreachable_server_hides_the_password(
    case: str, port: int, opened: list[Any], caplog_debug: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        DOWN_CASES[case](port, opened)
    assert MASKED in str(info.value), f"the message should still name the (masked) URL: {info.value}"
    _assert_hidden(caplog_debug, info.value, *opened)


# -- the real server refuses the login ---------------------------------------------------


def _pg_queue_refused(opened: list[Any]) -> None:
    require("postgres")
    open_queue_backend(_pg("foundry_no_such_role"))


def _pg_journal_refused(opened: list[Any]) -> None:
    require("postgres")
    open_journal(_pg("foundry_no_such_role"))


def _redis_queue_refused(opened: list[Any]) -> None:
    require("redis")
    opened.append(open_queue_backend(f"redis://foundry_no_such_user:{SECRET}@127.0.0.1:6379/0?reconnect=1"))
    opened[-1].stats("default")


def _redis_stream_refused(opened: list[Any]) -> None:
    require("redis")
    opened.append(open_stream_backend(f"redis://foundry_no_such_user:{SECRET}@127.0.0.1:6379/0"))
    opened[-1].streams()


def _amqp_refused(opened: list[Any]) -> None:
    require("rabbitmq")
    open_queue_backend(f"amqp://guest:{SECRET}@127.0.0.1:5672/?reconnect=1&state=memory://")


def _nats_refused(opened: list[Any]) -> None:
    # The shared NATS server runs without auth, so it would accept any login: this case
    # starts a private nats-server (the same binary) that requires a user and password.
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not os.path.exists(binary):
        require("nats")  # the server's binary goes with the server: skip or fail likewise
        pytest.fail(f"nats-server is reachable but its binary is not at {binary}")
    port = _free_port()
    server = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "--user", "foundry", "--pass", "the-right-one"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            assert time.monotonic() < deadline, "the private nats-server did not start in 10 s"
            time.sleep(0.05)
        opened.append(open_stream_backend(f"nats://foundry:{SECRET}@127.0.0.1:{port}"))
        opened[-1].streams()
    finally:
        server.terminate()
        server.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


REFUSED_CASES: dict[str, Callable[[list[Any]], None]] = {
    "postgres-queue": _pg_queue_refused,
    "postgres-journal": _pg_journal_refused,
    "redis-queue": _redis_queue_refused,
    "redis-stream": _redis_stream_refused,
    "amqp-queue": _amqp_refused,
    "nats-stream": _nats_refused,
}


@pytest.mark.parametrize("case", sorted(REFUSED_CASES))
def test_a_refused_login_hides_the_password(
    case: str, opened: list[Any], caplog_debug: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(FoundryError) as info:
        REFUSED_CASES[case](opened)
    assert isinstance(info.value, ConfigError | BackendUnavailableError), repr(info.value)
    assert MASKED in str(info.value), f"the message should still name the (masked) URL: {info.value}"
    _assert_hidden(caplog_debug, info.value, *opened)


# -- an open backend: its repr, and what it logs while working -----------------------------


def _accepted(open_: Callable[[], Any]) -> Any:
    """``open_()``, or a skip when the server wants a real password (the wrong one
    is then refused: that case is covered above)."""
    try:
        return open_()
    except BackendUnavailableError as exc:
        if "password" in str(exc) or "authentication" in str(exc):
            pytest.skip(f"the server checks passwords, so the made-up one is refused: {exc}")
        raise


def test_an_open_postgres_queue_and_journal_hide_the_password(
    opened: list[Any], caplog_debug: pytest.LogCaptureFixture
) -> None:
    require("postgres")  # trust authentication on 127.0.0.1 accepts any password
    schema = f"fq_secret_{uuid.uuid4().hex[:10]}"
    try:
        queue = _accepted(lambda: open_queue_backend(_pg("postgres", query=f"&schema={schema}")))
        opened.append(queue)
        journal = _accepted(lambda: open_journal(_pg("postgres", query=f"&schema={schema}")))
        opened.append(journal)
        assert queue.stats("default").depth == 0
        assert queue.claim("default", "w1", lease=5.0, limit=1, timeout=0.05) == []  # starts the listener
        assert MASKED in repr(queue)
        assert MASKED in repr(journal)
        _assert_hidden(caplog_debug, queue, journal)
    finally:
        for backend in opened:
            backend.close()
        opened.clear()
        _drop_schema(schema)


def test_an_open_amqp_queue_hides_its_state_store_password(
    opened: list[Any], caplog_debug: pytest.LogCaptureFixture
) -> None:
    broker = require("rabbitmq")
    require("postgres")
    tag = uuid.uuid4().hex[:10]
    schema = f"fq_secret_{tag}"
    state = quote(_pg("postgres", query=f"&schema={schema}"), safe="")
    try:
        queue = _accepted(lambda: open_queue_backend(f"{broker}?prefix=fqsecret{tag}&state={state}"))
        opened.append(queue)
        assert queue.stats("default").depth == 0
        assert "state=postgresql://postgres:***@" in repr(queue)
        _assert_hidden(caplog_debug, queue, queue.state)
        queue.destroy()
    finally:
        for backend in opened:
            backend.close()
        opened.clear()
        _drop_schema(schema)


def test_an_open_nats_stream_hides_the_password(
    opened: list[Any], caplog_debug: pytest.LogCaptureFixture
) -> None:
    require("nats")  # this server runs without auth and ignores the password
    stream = open_stream_backend(
        f"nats://foundry:{SECRET}@127.0.0.1:4222?prefix=fqsecret{uuid.uuid4().hex[:8]}"
    )
    opened.append(stream)
    assert isinstance(stream.streams(), list)
    assert repr(stream).startswith("<NatsStreamBackend nats://foundry:***@127.0.0.1:4222")
    _assert_hidden(caplog_debug, stream)


# -- what objects say about their URL -------------------------------------------------------


def test_settings_repr_and_description_mask_every_url(tmp_path: Path) -> None:
    settings = load_settings(
        tmp_path,
        queue=f"postgresql://app:{SECRET}@db/app",
        stream=f"nats://{SECRET}@h:4222",
        journal=f"postgresql://app@db/app?password={SECRET}",
        cwd=tmp_path,
    )
    for text in (repr(settings), str(settings), settings.describe()):
        assert SECRET not in text, text
        assert MASKED in text, text


def test_an_open_backend_url_is_the_masked_form(opened: list[Any]) -> None:
    """``backend.url`` is for showing; the password stays inside, with the driver."""
    require("postgres")
    require("redis")
    require("nats")
    schema = f"fq_secret_{uuid.uuid4().hex[:10]}"
    tag = uuid.uuid4().hex[:8]
    try:
        opened.append(_accepted(lambda: open_queue_backend(_pg("postgres", query=f"&schema={schema}"))))
        opened.append(_accepted(lambda: open_journal(_pg("postgres", query=f"&schema={schema}"))))
        opened.append(open_queue_backend(f"redis://default:{SECRET}@127.0.0.1:6379/0?prefix=fqs{tag}"))
        opened.append(open_stream_backend(f"redis://default:{SECRET}@127.0.0.1:6379/0?prefix=fqs{tag}"))
        opened.append(open_stream_backend(f"nats://foundry:{SECRET}@127.0.0.1:4222?prefix=fqs{tag}"))
        assert opened[0].stats("default").depth == 0  # they work: the driver has the password
        for backend in opened:
            assert SECRET not in backend.url, backend.url
            assert MASKED in backend.url, backend.url
            assert SECRET not in repr(backend), repr(backend)
    finally:
        for backend in opened:
            destroy = getattr(backend, "destroy", None)
            if callable(destroy):
                destroy()
            backend.close()
        opened.clear()
        _drop_schema(schema)
