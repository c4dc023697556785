"""``actions.finish``: running -> terminal once, every field of the outcome stored as
the ORM stores it (PostgreSQL writes it in one statement built once, not compiled per
call), and the sweep's ``interrupted`` guess the only terminal status a late result
replaces."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone

from controlplane.executions import actions, fields
from controlplane.executions.models import Execution, Status
from controlplane.pool.outcome import WORKER_LOST, Outcome

pytestmark = pytest.mark.django_db

OUTCOME = Outcome(
    "failed", exit_code=3, stdout="out\0" + fields.ENCODED_PREFIX, stderr="é\n", error="", duration_ms=17,
    host_id="host-7", attempts=2,
)  # fmt: skip


def _row(status: str, **values) -> Execution:
    started = timezone.now() - timedelta(seconds=1)
    return Execution.objects.create(
        owner="t", code="x", timeout_ms=1000, memory_mb=64, status=status, started_at=started, attempts=1, **values
    )


def test_a_running_execution_stores_every_field_of_its_outcome():
    row = _row(Status.RUNNING)
    before = timezone.now()
    assert actions.finish(str(row.pk), OUTCOME) is True
    row.refresh_from_db()
    stored = (row.status, row.exit_code, row.stdout, row.stderr, row.error, row.duration_ms, row.host_id)
    assert stored == ("failed", 3, OUTCOME.stdout, "é\n", "", 17, "host-7")
    assert row.attempts == 3  # added to the attempts already counted
    assert before <= row.finished_at <= timezone.now()
    # The NUL went through the field's own encoding, as an ORM update stores it.
    stored_stdout = Execution.objects.filter(pk=row.pk).values_list(Cast("stdout", TextField()), flat=True).get()
    assert stored_stdout == fields.encode(OUTCOME.stdout) != OUTCOME.stdout


def test_a_result_replaces_the_sweep_s_guess_that_its_worker_was_lost():
    row = _row(Status.INTERRUPTED, error=WORKER_LOST)
    assert actions.finish(str(row.pk), OUTCOME) is True
    row.refresh_from_db()
    assert (row.status, row.error, row.exit_code, row.attempts) == ("failed", "", 3, 3)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (Status.QUEUED, ""),
        (Status.SUCCEEDED, ""),
        (Status.CANCELLED, "Execution was cancelled"),
        (Status.INTERRUPTED, "interrupted for another reason"),
        (Status.TIMED_OUT, "Execution timed out after 1000 ms"),
    ],
)
def test_no_other_status_is_overwritten(status, error):
    row = _row(status, error=error)
    before = Execution.objects.filter(pk=row.pk).values().get()
    assert actions.finish(str(row.pk), OUTCOME) is False
    assert Execution.objects.filter(pk=row.pk).values().get() == before


def test_a_second_result_for_the_same_execution_changes_nothing():
    row = _row(Status.RUNNING)
    assert actions.finish(str(row.pk), Outcome("succeeded", exit_code=0, stdout="1\n", duration_ms=1)) is True
    after_first = Execution.objects.filter(pk=row.pk).values().get()
    assert actions.finish(str(row.pk), OUTCOME) is False
    assert Execution.objects.filter(pk=row.pk).values().get() == after_first
