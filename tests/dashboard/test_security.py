"""The dashboard's security model over real HTTP: loopback by default, a token anywhere
else, Host checks against DNS rebinding, POST-only actions behind a CSRF token and a
same-origin check, a strict Content-Security-Policy, and no password on any page."""

from __future__ import annotations

import http.client
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundry.config import load_settings
from foundry.errors import ConfigError
from foundry.observe.dashboard import DashboardServer, Sources
from tests.services import require

TOKEN = "a-long-enough-test-token-0123456789"


def _sources(tmp_path: Path, **urls: str) -> Sources:
    urls.setdefault("fleet", (tmp_path / "fleet").as_uri())
    return Sources(None, settings=load_settings(home=tmp_path / ".foundry"), **urls)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DashboardServer]:
    s = DashboardServer(_sources(tmp_path), "127.0.0.1", 0)
    try:
        yield s
    finally:
        s.close()


def request(
    server: DashboardServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    host: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        all_headers = {"Host": host or f"127.0.0.1:{server.port}", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def csrf_of(server: DashboardServer) -> str:
    _, _, page = request(server, "GET", "/")
    match = re.search(rb'name="foundry-csrf" content="([^"]+)"', page)
    assert match is not None
    return match.group(1).decode()


def test_it_listens_on_loopback_by_default_and_refuses_elsewhere_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FOUNDRY_DASHBOARD_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="without a token"):
        DashboardServer(_sources(tmp_path), "0.0.0.0", 0)
    with pytest.raises(ConfigError, match="16 characters"):
        DashboardServer(_sources(tmp_path), "0.0.0.0", 0, token="short")
    s = DashboardServer(_sources(tmp_path), port=0)
    try:
        assert s.host == "127.0.0.1"
    finally:
        s.close()


def test_a_token_guards_every_request(tmp_path: Path) -> None:
    s = DashboardServer(_sources(tmp_path), "0.0.0.0", 0, token=TOKEN)
    try:
        assert request(s, "GET", "/")[0] == 401
        assert request(s, "GET", "/api/meta")[0] == 401
        assert request(s, "GET", "/api/meta", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert request(s, "GET", "/api/meta", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        # opening /?token= once sets an HttpOnly, SameSite=Strict cookie that carries on
        status, headers, _ = request(s, "GET", f"/?token={TOKEN}")
        assert status == 303
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert TOKEN not in cookie
        value = cookie.split(";")[0]
        assert request(s, "GET", "/api/meta", headers={"Cookie": value})[0] == 200
        assert request(s, "GET", "/api/meta", headers={"Cookie": "foundry_dashboard=forged"})[0] == 401
    finally:
        s.close()


def test_a_foreign_host_header_is_refused_on_loopback(server: DashboardServer) -> None:
    """A page on evil.example that resolves its name to 127.0.0.1 (DNS rebinding)."""
    assert request(server, "GET", "/api/meta", host="evil.example:8464")[0] == 421
    assert request(server, "GET", "/api/meta", host=f"localhost:{server.port}")[0] == 200


def test_actions_need_post_json_the_csrf_token_and_the_same_origin(server: DashboardServer) -> None:
    token = csrf_of(server)
    good = {"Content-Type": "application/json", "X-Foundry-CSRF": token}
    path = "/api/workflows/nope/cancel"
    # GET never acts
    assert request(server, "GET", path)[0] == 404
    # no token, a wrong one, a form post, another origin: refused before anything runs
    assert request(server, "POST", path, {}, {"Content-Type": "application/json"})[0] == 403
    assert request(server, "POST", path, {}, {**good, "X-Foundry-CSRF": "guess"})[0] == 403
    assert (
        request(server, "POST", path, b"a=1", {**good, "Content-Type": "application/x-www-form-urlencoded"})[
            0
        ]
        == 403
    )
    assert request(server, "POST", path, {}, {**good, "Origin": "http://evil.example"})[0] == 403
    # the page's own request reaches the API (which answers: no such workflow)
    status, _, body = request(server, "POST", path, {}, {**good, "Origin": f"http://127.0.0.1:{server.port}"})
    assert status == 409, body
    assert request(server, "PUT", path, {}, good)[0] == 405
    assert request(server, "POST", path, b"x" * 300_000, good)[0] == 413


def test_the_page_runs_only_its_own_script(server: DashboardServer) -> None:
    status, headers, page = request(server, "GET", "/")
    assert status == 200
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert b"<script>" not in page  # no inline script: CSP forbids it anyway
    assert b"http://" not in page
    assert b"https://" not in page
    _, _, js = request(server, "GET", "/static/app.js")
    assert b"innerHTML" not in js
    assert b"insertAdjacentHTML" not in js
    assert b"document.write" not in js
    assert request(server, "GET", "/static/../server.py")[0] == 404


def _every_body(server: DashboardServer) -> bytes:
    bodies = [
        request(server, "GET", p)[2] for p in ("/", "/api/meta", "/api/live", "/api/jobs", "/api/fleet")
    ]
    return b"\n".join(bodies)


def test_passwords_in_engine_urls_never_reach_the_page(tmp_path: Path) -> None:
    base = require("postgres")  # trust auth: the password is accepted and ignored
    user_host = base.split("://", 1)[1].split("@", 1)
    schema = f"dash_sec_{uuid.uuid4().hex[:8]}"
    url = f"postgresql://{user_host[0]}:Sup3rSecretPw@{user_host[1]}?schema={schema}"
    s = DashboardServer(_sources(tmp_path, queue=url, journal=url), "127.0.0.1", 0)
    try:
        everything = _every_body(s)
        assert b"Sup3rSecretPw" not in everything
        assert b"***" in everything  # the URL is shown, masked
    finally:
        s.close()
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_password_in_an_engine_error_is_scrubbed(tmp_path: Path) -> None:
    url = "redis://app:Sup3rSecretPw@127.0.0.1:1/0?reconnect=0.2&socket_timeout=0.2"
    s = DashboardServer(_sources(tmp_path, queue=url), "127.0.0.1", 0)
    try:
        everything = _every_body(s)
        assert b"Sup3rSecretPw" not in everything
        assert b"redis://app:***@127.0.0.1:1/0" in everything
    finally:
        s.close()
