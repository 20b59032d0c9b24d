"""TLS URLs (``rediss://``, ``amqps://``) end to end, over real TLS.

No broker here speaks TLS, so each test puts a TLS-terminating proxy (:class:`TlsProxy`)
in front of the local Redis or RabbitMQ: it accepts TLS on a free 127.0.0.1 port with a
certificate signed by a CA made for the test run, and forwards the plain bytes. The
proxy counts the handshakes it completed, so a test also proves its traffic went
through TLS. Then: a queue job and a stream event round-trip through ``rediss://`` and
``amqps://`` (with the AMQP state store on ``rediss://`` too); a client trusting another
CA is refused with a ConfigError that names the option to fix; a plain URL to the TLS
port fails within seconds; and the TLS options are checked before any connection.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import pytest

from foundry.backends.queue import JobStatus, open_queue_backend
from foundry.backends.stream import NewEvent, Start, StreamConfig, open_stream_backend
from foundry.config import load_settings
from foundry.errors import BackendUnavailableError, ConfigError
from tests.backends.queue._helpers import LONG, Namespace, expect, job
from tests.services import SERVICES, require

pytest.importorskip("redis")

BOUND = 10.0  # seconds within which every failure below must be reported


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server certificate
    other_ca: Path  # a CA that signed nothing the proxy shows
    cert: Path  # server certificate for 127.0.0.1 and localhost
    key: Path


def _with_cryptography(d: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def write(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        return path

    def new_ca(name: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return key, cert

    ca_key, ca_cert = new_ca("Foundry test CA")
    _, other_cert = new_ca("Some other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return Pki(
        ca=write(d / "ca.pem", ca_cert.public_bytes(pem)),
        other_ca=write(d / "other-ca.pem", other_cert.public_bytes(pem)),
        cert=write(d / "server.pem", cert.public_bytes(pem)),
        key=write(
            d / "server.key",
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        ),
    )


def _with_openssl(d: Path) -> Pki:
    def run(command: str) -> None:  # file names relative to d, so no path needs quoting
        subprocess.run(["openssl", *command.split()], cwd=d, check=True, capture_output=True, timeout=30)

    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
    ca_ext = "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
    run(f"req -x509 {ec} -keyout ca.key -out ca.pem -subj /CN=Foundry-test-CA {ca_ext}")
    run(f"req -x509 {ec} -keyout other-ca.key -out other-ca.pem -subj /CN=Some-other-CA {ca_ext}")
    run(f"req {ec} -keyout server.key -out server.csr -subj /CN=127.0.0.1")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\n"
    )
    sign = "-CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile server.ext"
    run(f"x509 -req -in server.csr {sign} -out server.pem")
    return Pki(ca=d / "ca.pem", other_ca=d / "other-ca.pem", cert=d / "server.pem", key=d / "server.key")


def make_pki(d: Path, *, openssl: bool = False) -> Pki:
    """A CA, a server certificate it signed, and an unrelated CA: with the
    ``cryptography`` package when it is installed, else the ``openssl`` command."""
    if not openssl:
        try:
            import cryptography  # noqa: F401
        except ImportError:
            openssl = True
    return _with_openssl(d) if openssl else _with_cryptography(d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class TlsProxy:
    """Accepts TLS on a free 127.0.0.1 port and forwards the plain bytes to
    127.0.0.1:``upstream`` (and back), on an event loop of its own thread."""

    def __init__(self, upstream: int, pki: Pki) -> None:
        self.upstream = upstream
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pki.cert, pki.key)
        self.handshakes = 0  # TLS connections accepted (the handshake completed)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-proxy", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context, ssl_handshake_timeout=5.0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(5.0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream), 5.0
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        self._writers.append(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
            self._loop.close()


@pytest.fixture
def redis_tls(pki: Pki) -> Iterator[TlsProxy]:
    require("redis")
    with TlsProxy(SERVICES["redis"][1], pki) as proxy:
        yield proxy


@pytest.fixture
def rabbit_tls(pki: Pki) -> Iterator[TlsProxy]:
    require("rabbitmq")
    with TlsProxy(SERVICES["rabbitmq"][1], pki) as proxy:
        yield proxy


def tag() -> str:
    return uuid.uuid4().hex[:10]


def round_trip(backend: Any) -> None:
    """Submit a job, claim it, complete it, read its result."""
    new = job("q")
    assert backend.enqueue(new).created
    claimed = backend.claim("q", "w", lease=LONG, limit=1, timeout=10)
    assert [c.id for c in claimed] == [new.id]
    assert backend.complete(new.id, claimed[0].token, b'"ok"')
    assert expect(backend.wait(new.id, timeout=10), JobStatus.SUCCEEDED).result == b'"ok"'


# -- the round trips -------------------------------------------------------------------


def test_a_redis_queue_job_round_trips_over_rediss(redis_tls: TlsProxy, pki: Pki) -> None:
    url = f"rediss://127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={pki.ca}&prefix=fqtls{tag()}"
    with Namespace(url, object) as ns:
        round_trip(ns.open())
    assert redis_tls.handshakes >= 1


def test_an_amqp_queue_job_round_trips_over_amqps_with_its_state_on_rediss(
    rabbit_tls: TlsProxy, redis_tls: TlsProxy, pki: Pki
) -> None:
    pytest.importorskip("aiormq")
    state = quote(f"rediss://127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={pki.ca}", safe="")
    url = (
        f"amqps://guest:guest@127.0.0.1:{rabbit_tls.port}/?cafile={pki.ca}&prefix=fqtls{tag()}&state={state}"
    )
    with Namespace(url, object) as ns:
        backend = ns.open()
        assert type(backend.state).__name__ == "RedisQueue"  # type: ignore[attr-defined]
        round_trip(backend)
    assert rabbit_tls.handshakes >= 1
    assert redis_tls.handshakes >= 1


def test_a_stream_event_round_trips_over_rediss(redis_tls: TlsProxy, pki: Pki) -> None:
    url = f"rediss://127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={pki.ca}&prefix=fstls{tag()}"
    backend = open_stream_backend(url)
    name = f"s-{tag()}"
    try:
        backend.ensure_stream(StreamConfig(name))
        [appended] = backend.append(name, [NewEvent(id="e1", payload=b'"hello"')])
        assert backend.create_group(name, "g", Start.beginning())
        [event] = backend.read(name, "g", appended.partition, "c", max=10, ack_deadline=30, timeout=5)
        assert (event.id, event.payload, event.offset) == ("e1", b'"hello"', appended.offset)
        backend.commit(name, "g", event.partition, event.offset)
        assert backend.read(name, "g", event.partition, "c", max=10, ack_deadline=30, timeout=0) == []
    finally:
        backend.delete_stream(name)
        backend.close()
    assert redis_tls.handshakes >= 1


# -- failures: bounded, and saying what to fix -------------------------------------------


def first_stream_call_fails(url: str, error: type[Exception], match: str) -> None:
    """The stream at ``url`` opens (it connects lazily); its first call raises ``error``
    matching ``match`` within :data:`BOUND` seconds."""
    stream = open_stream_backend(url)
    started = time.monotonic()
    try:
        with pytest.raises(error, match=match):
            stream.streams()
    finally:
        stream.close()
    assert time.monotonic() - started < BOUND


def test_a_server_certificate_from_another_ca_is_refused_clearly(
    redis_tls: TlsProxy, rabbit_tls: TlsProxy, pki: Pki
) -> None:
    pytest.importorskip("aiormq")
    cases: list[tuple[str, str, Any]] = [
        ("ssl_ca_certs", f"rediss://127.0.0.1:{redis_tls.port}/0?prefix=fqtls{tag()}", open_queue_backend),
        (
            "cafile",
            f"amqps://guest:guest@127.0.0.1:{rabbit_tls.port}/?prefix=fqtls{tag()}&state=memory://",
            open_queue_backend,
        ),
    ]
    for option, url, opener in cases:
        started = time.monotonic()
        with pytest.raises(ConfigError) as err:
            opener(f"{url}&{option}={pki.other_ca}")
        assert time.monotonic() - started < BOUND
        message = str(err.value)
        assert "certificate" in message
        assert f"Fix: set {option}=" in message
        assert "guest:guest" not in message
    # The stream connects lazily: its first call is refused the same way
    stream_url = f"rediss://127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={pki.other_ca}"
    first_stream_call_fails(stream_url, ConfigError, r"certificate was refused .*Fix: set ssl_ca_certs=")


def test_a_plain_redis_url_to_a_tls_port_fails_within_seconds(redis_tls: TlsProxy) -> None:
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=r"use rediss://"):
        open_queue_backend(f"redis://127.0.0.1:{redis_tls.port}/0?prefix=fqtls{tag()}&reconnect=1")
    assert time.monotonic() - started < BOUND
    first_stream_call_fails(
        f"redis://127.0.0.1:{redis_tls.port}/0", BackendUnavailableError, r"use rediss://"
    )


def test_a_rediss_url_to_a_plain_port_fails_within_seconds() -> None:
    require("redis")
    host, port = SERVICES["redis"]
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=r"use redis://"):
        open_queue_backend(f"rediss://{host}:{port}/0?prefix=fqtls{tag()}&reconnect=1&socket_timeout=1")
    assert time.monotonic() - started < BOUND


# -- the options are checked before anything connects ------------------------------------


def test_tls_schemes_are_known_to_the_settings() -> None:
    settings = load_settings(queue="amqps://h/", stream="rediss://h:6380/0", cwd=Path("/nonexistent"))
    assert (settings.queue, settings.stream) == ("amqps://h/", "rediss://h:6380/0")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # a CA file that does not exist: the option, the value and the fix
        (
            "rediss://u:s3cret@h:1/0?ssl_ca_certs=/no/such/ca.pem",
            r"ssl_ca_certs='/no/such/ca.pem' is not a file",
        ),
        ("amqps://u:s3cret@h:1/?cafile=/no/such/ca.pem", r"cafile='/no/such/ca.pem' is not a file"),
        # a TLS option on a plain URL would be silently ignored by the driver
        ("redis://u:s3cret@h:1/0?ssl_cert_reqs=none", r"only apply to TLS.*Fix: use rediss://"),
        ("amqp://u:s3cret@h:1/?no_verify_ssl=1", r"only apply to TLS.*Fix: use amqps://"),
        # values outside the accepted set
        (
            "rediss://u:s3cret@h:1/0?ssl_cert_reqs=maybe",
            r"ssl_cert_reqs='maybe' is not one of none, optional",
        ),
        (
            "rediss://u:s3cret@h:1/0?ssl_check_hostname=yes",
            r"ssl_check_hostname='yes' is not one of true, false",
        ),
        ("amqps://u:s3cret@h:1/?no_verify_ssl=true", r"no_verify_ssl='true' is not one of 0, 1"),
        # options that the drivers take but Foundry does not pass through
        ("rediss://u:s3cret@h:1/0?ssl_password=x", r"unknown option\(s\) ssl_password.*ssl_ca_certs"),
        ("amqps://u:s3cret@h:1/?capath=/etc", r"unknown option\(s\) capath.*cafile"),
    ],
)
def test_bad_tls_options_are_config_errors_naming_the_fix(url: str, expected: str) -> None:
    if url.startswith("amqp"):
        pytest.importorskip("aiormq")
    with pytest.raises(ConfigError, match=expected) as err:
        open_queue_backend(url)
    assert "s3cret" not in str(err.value)
    assert "Fix:" in str(err.value)


def test_a_key_without_its_certificate_is_a_config_error(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"ssl_keyfile without ssl_certfile.*Fix: give the client"):
        open_queue_backend(f"rediss://h:1/0?ssl_keyfile={pki.key}")


def test_the_stream_url_checks_its_options_too() -> None:
    with pytest.raises(ConfigError, match=r"ssl_ca_certs='/no/such/ca.pem' is not a file") as err:
        open_stream_backend("rediss://u:s3cret@h:1/0?ssl_ca_certs=/no/such/ca.pem")
    assert "s3cret" not in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) sll_ca_certs"):
        open_stream_backend("rediss://h:1/0?sll_ca_certs=/x")


def handshake(ca: Path, made: Pki) -> None:
    """A TLS handshake in memory: a client trusting ``ca`` meets the test server."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(made.cert, made.key)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = ssl.create_default_context(cafile=str(ca)).wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    server = server_context.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for end in (client, server):
            try:
                end.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            return
    raise AssertionError("the in-memory handshake did not finish")


@pytest.mark.parametrize("openssl", [False, True], ids=["cryptography", "openssl"])
def test_the_test_certificates_verify_against_their_ca_only(tmp_path: Path, openssl: bool) -> None:
    made = make_pki(tmp_path, openssl=openssl)
    handshake(made.ca, made)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(made.other_ca, made)
