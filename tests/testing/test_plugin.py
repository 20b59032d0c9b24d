"""The pytest plugin, as a user meets it: their own app and test file, run by pytest with
Foundry installed (``pytester``)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from tests.testing._inner import PLUGIN, installed, run, session

ROOT = Path(__file__).resolve().parents[2]

# A user's application module: a queue unit, a failing one, a schedule and a workflow
# with a timer and a signal wait.
MYAPP = """
from foundry import Foundry

app = Foundry("shop")
TICKS: list[str] = []


class CardDeclined(Exception):
    pass


@app.work(durable=True)
def total(prices: list[float], tax: float) -> float:
    return round(sum(prices) * (1 + tax), 2)


@app.work(durable=True, retries=2)
def charge(card: str, amount: float) -> str:
    raise CardDeclined(f"card {card} declined for {amount}")


@app.work(schedule="every 60s")
def sync_prices(scheduled_at: str = "") -> None:
    TICKS.append(scheduled_at)


@app.workflow()
def order(wf, order_id: str) -> dict:
    wf.sleep("1h")                                    # a durable timer
    amount = wf.step(total, [10.0, 20.0], 0.1)
    approved = wf.wait_for("approve", timeout="2h", default=False)
    return {"order": order_id, "amount": amount, "approved": approved}
"""


def test_a_users_test_file_using_the_fixtures_passes(pytester: pytest.Pytester) -> None:
    # Given the user's app and a test file written against the fixtures
    pytester.makepyfile(myapp=MYAPP)
    pytester.makepyfile(
        test_shop="""
        import os
        from pathlib import Path

        import pytest

        from foundry import Foundry, SubmitError
        from myapp import CardDeclined, app, charge, order, sync_prices, total, TICKS


        def test_a_queue_job_runs_at_submit(foundry_sandbox):
            foundry_sandbox(app)
            handle = total.submit([1.0, 2.0], 0.5)
            assert handle.status == "succeeded"          # no worker: it ran in submit
            assert handle.result(timeout=0) == 4.5


        def test_state_lives_in_the_test_home(foundry_sandbox, foundry_home):
            sandbox = foundry_sandbox(app)
            total.submit([1.0], 0.0).result(timeout=0)
            order.start("o-0")
            assert app.settings.home == sandbox.home
            assert sandbox.home.is_relative_to(foundry_home)
            assert (sandbox.home / "journal.db").exists()
            assert os.environ["FOUNDRY_HOME"] == str(foundry_home)


        def test_an_inline_app(foundry_app):
            @foundry_app.work(durable=True)
            def double(x: int) -> int:
                return 2 * x

            assert double.submit(21).result(timeout=0) == 42


        def test_a_timer_and_a_signal_on_the_manual_clock(foundry_sandbox, foundry_clock):
            foundry_sandbox(app)
            handle = order.start("o-1")
            foundry_clock.advance(3599)
            assert handle.status == "running"            # asleep: one second to go
            foundry_clock.advance(1)
            app.signal(handle.id, "approve", True)
            assert handle.result(timeout=10) == {"order": "o-1", "amount": 33.0, "approved": True}


        def test_a_wait_for_times_out_on_the_manual_clock(foundry_sandbox, foundry_clock):
            foundry_sandbox(app)
            handle = order.start("o-2")
            foundry_clock.advance(3600 + 7200)
            assert handle.result(timeout=10)["approved"] is False


        def test_a_schedule_ticks_as_the_clock_passes(foundry_sandbox, foundry_clock):
            foundry_sandbox(app)
            TICKS.clear()
            foundry_clock.advance(180)
            assert len(TICKS) == 3                       # one run per tick, each at its own time
            assert len(set(TICKS)) == 3


        def test_a_failing_job_raises_its_own_error(foundry_sandbox):
            foundry_sandbox(app)
            with pytest.raises(CardDeclined, match="card 4242 declined for 9.5") as caught:
                charge.submit("4242", 9.5).result(timeout=0)
            assert any(entry.path.name == "myapp.py" for entry in caught.traceback)


        def test_an_unserializable_payload_fails_at_submit(foundry_sandbox):
            foundry_sandbox(app)
            with pytest.raises(SubmitError, match="declared list"):
                total.submit({1.0, 2.0}, 0.1)            # a set, not the list declared


        def test_nothing_is_left_in_the_working_directory():
            assert not Path(".foundry").exists()
        """
    )
    # When pytest runs it
    result = run(pytester)
    # Then every test passes, and nothing was written where it ran
    result.assert_outcomes(passed=9)
    assert not (pytester.path / ".foundry").exists()


def test_eager_and_real_deliveries_refuse_a_payload_with_the_same_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(myapp=MYAPP)
    pytester.makepyfile(
        test_payload="""
        import datetime as dt

        import pytest

        from foundry import SubmitError
        from myapp import app, total

        def refusal(foundry_sandbox, eager):
            sandbox = foundry_sandbox(app, eager=eager)
            try:
                with pytest.raises(SubmitError) as caught:
                    total.submit([dt.datetime(2026, 1, 1)], 0.1)
            finally:
                sandbox.close()
            return str(caught.value)

        def test_same_error(foundry_sandbox):
            eager = refusal(foundry_sandbox, True)
            real = refusal(foundry_sandbox, False)    # the real queue runner, on SQLite
            assert eager == real
            assert "unit 'total'" in eager and "Fix:" in eager
        """
    )
    run(pytester).assert_outcomes(passed=1)


def test_a_failing_test_of_user_code_fails(pytester: pytest.Pytester) -> None:
    # The fixtures must not make a wrong expectation pass: a job's failure reaches the test.
    pytester.makepyfile(myapp=MYAPP)
    pytester.makepyfile(
        test_wrong="""
        from myapp import app, charge

        def test_expects_success(foundry_sandbox):
            foundry_sandbox(app)
            assert charge.submit("4242", 1.0).result(timeout=0) == "ok"
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CardDeclined: card 4242 declined for 1.0*"])


def test_the_plugin_is_declared_as_a_pytest11_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"foundry": PLUGIN}


def test_an_installed_foundry_loads_the_plugin_by_itself(pytester: pytest.Pytester) -> None:
    if not installed():
        why = "this install of foundry-exec predates its pytest11 entry point: pip install -e ."
        if os.environ.get("CI") == "true":  # CI installs the package fresh: the entry point must be there
            pytest.fail(why)
        pytest.skip(why)
    pytester.makepyfile(test_listed="def test_nothing():\n    pass\n")
    result = session(pytester, "--fixtures")
    result.stdout.fnmatch_lines(["*foundry_home*", "*foundry_clock*", "*foundry_sandbox*", "*foundry_app*"])


def test_a_session_that_uses_no_fixture_is_untouched(pytester: pytest.Pytester) -> None:
    # Given a project that does not use Foundry's fixtures, with fixtures and an option of
    # its own named like ours would be if they were not prefixed
    pytester.makeconftest(
        """
        import pytest

        def pytest_addoption(parser):
            parser.addoption("--clock", default="real")

        @pytest.fixture
        def clock(request):
            return request.config.getoption("--clock")

        @pytest.fixture
        def app():
            return "their app"
        """
    )
    pytester.makepyfile(
        test_theirs="""
        import os

        def test_theirs(clock, app):
            assert clock == "real" and app == "their app"
            assert "FOUNDRY_HOME" not in os.environ
        """
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FOUNDRY_HOME", raising=False)
        run(pytester).assert_outcomes(passed=1)


def test_the_plugin_defines_fixtures_only() -> None:
    import ast

    import foundry.testing.plugin as plugin

    # no hook: no option, no change to collection, running or reporting
    assert [name for name in vars(plugin) if name.startswith("pytest_")] == []
    tree = ast.parse(Path(plugin.__file__).read_text())
    fixtures = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            (decorator,) = node.decorator_list  # every function of it is a fixture, and only that
            assert ast.unparse(decorator) == "pytest.fixture", node.name  # no autouse=, no scope=
            fixtures[node.name] = node
    assert sorted(fixtures) == sorted(plugin.__all__)
    assert all(name.startswith("foundry_") for name in fixtures)
