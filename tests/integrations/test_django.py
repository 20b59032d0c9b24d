"""The Django integration against real Django, on the example project
(``examples/django_shop``) with its SQLite database, in processes of its own (Django's
settings are per process): an order whose transaction rolls back enqueues nothing, one
that commits enqueues its job only at the commit, and ``foundry worker
foundry.integrations.django:app`` — Django set up by the attribute — runs it against the
project's database. ``settings.FOUNDRY`` with an unknown key fails at startup naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "django_shop"


def _run(tmp_path: Path, *argv: str, code: str | None = None, **extra: str) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
        "SHOP_DATA": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        **extra,
    }
    env.pop("FOUNDRY_HOME", None)
    command = [sys.executable, *(argv if code is None else ("-c", textwrap.dedent(code)))]
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command[1:3]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


WEB = """
    import django
    django.setup()
    from django.db import transaction
    from django.test import Client
    from foundry.backends.queue import open_queue_backend
    from foundry.integrations.django import get_app, submit_on_commit
    from orders.models import Order
    from orders.tasks import send_confirmation

    queue = open_queue_backend(get_app().settings.queue)
    def queued():
        stats = queue.stats("default")
        return stats.depth + stats.scheduled + stats.running

    client = Client()
    # a declined payment: the view's transaction rolls back, with the submit in it
    declined = client.post("/orders", '{"email": "bob@example.com", "declined": true}', "application/json")
    assert declined.status_code == 402, declined.content
    assert Order.objects.count() == 0 and queued() == 0, (Order.objects.count(), queued())
    # a paid one commits: its job is enqueued then, and not before
    with transaction.atomic():
        order = Order.objects.create(email="ada@example.com")
        submit_on_commit(send_confirmation, order.id)
        assert queued() == 0, "enqueued before the commit"
    assert queued() == 1
    # and one through the view
    created = client.post("/orders", '{"email": "cy@example.com"}', "application/json")
    assert created.status_code == 201, created.content
    assert queued() == 2
    # a bad argument fails before anything commits
    try:
        with transaction.atomic():
            Order.objects.create(email="dee@example.com")
            submit_on_commit(send_confirmation.options(key="bad"), object())
    except Exception as exc:
        print("refused:", type(exc).__name__)
    assert Order.objects.count() == 2 and queued() == 2
    queue.close()
    print("web ok")
"""

AFTER = """
    import django
    django.setup()
    from orders.models import Order
    print(sorted((o.email, o.confirmed) for o in Order.objects.all()))
"""


def test_a_rolled_back_order_enqueues_nothing_and_a_committed_one_runs_on_a_worker(tmp_path: Path) -> None:
    # Given the example project migrated on a fresh SQLite database
    _run(tmp_path, "manage.py", "migrate", "--noinput")
    # When the web process takes a declined order, a paid one, and one with a bad argument
    out = _run(tmp_path, code=WEB)
    assert "refused: SubmitError" in out
    assert out.strip().endswith("web ok")
    # And a worker started on the integration's app drains the queue
    _run(tmp_path, "-m", "foundry.cli", "worker", "foundry.integrations.django:app", "--burst", "-q")
    # Then the committed orders are confirmed by their jobs, and nothing else ran
    assert _run(tmp_path, code=AFTER).strip() == str([("ada@example.com", True), ("cy@example.com", True)])


def test_an_unknown_foundry_setting_fails_at_startup_naming_the_closest_key(tmp_path: Path) -> None:
    code = """
        import django
        from django.conf import settings
        settings.configure(INSTALLED_APPS=["foundry.integrations.django"], FOUNDRY={"queeu": "sqlite:///x.db"})
        from foundry.errors import ConfigError
        try:
            django.setup()
        except ConfigError as exc:
            print(exc)
    """
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "settings.FOUNDRY: unknown key 'queeu'. Fix: did you mean 'queue'?" in done.stdout


def test_the_app_attribute_without_settings_names_the_fix(tmp_path: Path) -> None:
    code = """
        from foundry.errors import ConfigError
        try:
            from foundry.integrations.django import app
        except ConfigError as exc:
            print(exc)
    """
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "set DJANGO_SETTINGS_MODULE=mysite.settings" in done.stdout
