"""Output that PostgreSQL text cannot hold is still a result: NUL and binary output come
back as the host sent them, and a result the database refuses for good becomes a
``failed`` execution that says so, never a row stuck in ``running``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.executions import fields
from controlplane.pool.outcome import Outcome
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import wait_until

pytestmark = pytest.mark.peer

BINARY_SNIPPET = (
    "import sys\n"
    "sys.stdout.write('a\\0b\\n' + fields_prefix)\n"
    "sys.stdout.flush()\n"
    "sys.stdout.buffer.write(bytes(range(256)))\n"
    "sys.stderr.write('err\\0')\n"
)
EXPECTED_STDOUT = "a\0b\n" + fields.ENCODED_PREFIX + bytes(range(256)).decode("utf-8", errors="replace")


@given(st.text())
def test_any_text_round_trips_through_the_encoding(text):
    stored = fields.encode(text)
    assert "\x00" not in stored
    assert fields.decode(stored) == text


def test_text_without_nul_is_stored_as_is():
    assert fields.encode("hello\n") == "hello\n"


@pytest.mark.django_db
def test_postgresql_stores_and_returns_nul_and_the_prefix_unchanged():
    from controlplane.executions.models import Execution

    row = Execution.objects.create(owner="t", code="x", timeout_ms=1000, memory_mb=64, stdout="a\0b", stderr="\0")
    Execution.objects.filter(pk=row.pk).update(stderr=fields.ENCODED_PREFIX + "x\0")
    row = Execution.objects.get(pk=row.pk)
    assert (row.stdout, row.stderr) == ("a\0b", fields.ENCODED_PREFIX + "x\0")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_nul_and_binary_output_is_stored_and_given_back(sandbox_token, owners):
    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    code = f"fields_prefix = {fields.ENCODED_PREFIX!r}\n" + BINARY_SNIPPET
    with start_host(sandbox_token) as host:
        env = {"HOLDFAST_SANDBOX_URL": host.url, "HOLDFAST_SANDBOX_TOKEN": sandbox_token}
        with start_worker(env, concurrency=2):
            pk = submit(code, owner="binary-test", timeout_s=10)
            row = wait_until(
                lambda: Execution.objects.filter(pk=pk, status="succeeded").first(), timeout=30, what="a stored result"
            )
    assert row.stdout == EXPECTED_STDOUT
    assert row.stderr == "err\0"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_result_the_database_refuses_becomes_failed_with_a_clear_error(sandbox_token, owners):
    """A host id longer than the column (varchar 64) makes PostgreSQL refuse the result
    with DataError on every attempt: the row must not stay running."""
    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    with start_host(sandbox_token, host_id="h" * 80) as host:
        env = {"HOLDFAST_SANDBOX_URL": host.url, "HOLDFAST_SANDBOX_TOKEN": sandbox_token}
        with start_worker(env, concurrency=2):
            pk = submit("print('ran')", owner="refused-test", timeout_s=10)
            row = wait_until(
                lambda: Execution.objects.filter(pk=pk).exclude(status__in=["queued", "running"]).first(),
                timeout=30,
                what="a terminal row",
            )
    assert row.status == "failed"
    assert row.exit_code == 0
    assert row.error.startswith("The execution ran (succeeded) but the database refused its result")
    assert "too long" in row.error


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("outcome", "stored"),
    [
        (Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=0), 0),  # ran under a millisecond
        (Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=12), 12),
        (Outcome.system("interrupted", "lost"), None),  # nothing was measured
    ],
)
def test_a_run_under_a_millisecond_has_a_duration_and_one_never_measured_has_none(outcome, stored):
    from controlplane.executions import actions
    from controlplane.executions.models import Execution

    row = Execution.objects.create(owner="t", code="x", timeout_ms=1000, memory_mb=64, status="running")
    assert actions.finish(str(row.pk), outcome)
    assert Execution.objects.get(pk=row.pk).duration_ms == stored


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("exit_code", "duration_ms", "kept_exit_code"),
    [(0, -5, 0), (2**40, 3, None), (1, 2**40, 1)],
)
def test_a_result_refused_for_a_number_out_of_range_is_stored_failed_without_it(exit_code, duration_ms, kept_exit_code):
    from controlplane.executions import tasks
    from controlplane.executions.models import Execution

    row = Execution.objects.create(owner="t", code="x", timeout_ms=1000, memory_mb=64, status="running")
    tasks._store(str(row.pk), Outcome("succeeded", exit_code=exit_code, duration_ms=duration_ms, host_id="h"))
    row = Execution.objects.get(pk=row.pk)
    assert (row.status, row.exit_code, row.duration_ms) == ("failed", kept_exit_code, None)
    assert row.error.startswith("The execution ran (succeeded) but the database refused its result")
