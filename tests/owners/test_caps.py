"""Admission (controlplane/owners/admission.py): unknown and disabled owners are refused,
an owner over one of its caps gets owner_limit (429) while other owners are not
affected, a full deployment gives at_capacity (503), and the owner's state is read
after its lock is granted, so two submits cannot both pass one cap.

Rows standing for work already running are written directly where only their count
matters (a worker cannot be made to hold 200 executions here); every refusal and
every acceptance goes through the real ``submit``/``execute``/``create_run``."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from controlplane.executions.api import execute, submit
from controlplane.executions.models import Execution
from controlplane.owners import admission
from controlplane.owners.errors import AtCapacity, OwnerDisabled, OwnerLimit, UnknownOwner
from controlplane.owners.models import Owner
from controlplane.runs import actions as runs
from holdfast_wire.logfmt import FIELDS_ATTR
from tests.timing import scaled

pytestmark = pytest.mark.django_db

JOB = {"kind": "shell", "command": "true"}


def _rows(owner: str, status: str, n: int) -> None:
    Execution.objects.bulk_create(
        Execution(owner=owner, code="x", timeout_ms=1000, memory_mb=64, status=status) for _ in range(n)
    )


def test_an_unknown_owner_is_refused_everywhere():
    for call in (
        lambda: submit("print(1)", owner="nobody"),
        lambda: execute("print(1)", owner="nobody"),
        lambda: runs.create_run("nobody", JOB),
    ):
        with pytest.raises(UnknownOwner) as refused:
            call()
        assert refused.value.code == "unknown_owner"
    assert not Execution.objects.exists()


def test_a_disabled_owner_is_refused_everywhere():
    Owner.objects.create(name="gone", is_active=False)
    for call in (lambda: submit("print(1)", owner="gone"), lambda: runs.create_run("gone", JOB)):
        with pytest.raises(OwnerDisabled):
            call()
    assert not Execution.objects.exists()


@pytest.mark.parametrize(
    ("command", "args"),
    [("execute", ["--code", "print(1)"]), ("create_run", ["--shell", "true"])],
)
def test_the_commands_say_so_in_one_line_for_an_unknown_owner(command, args):
    with pytest.raises(CommandError) as refused:
        call_command(command, "--owner", "nobody", *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert str(refused.value).startswith("unknown owner 'nobody'")
    assert "\n" not in str(refused.value)


def test_the_201st_active_execution_of_an_owner_is_refused_with_the_defaults():
    Owner.objects.create(name="busy")
    Owner.objects.create(name="bystander")
    _rows("busy", "running", 199)
    submit("print(1)", owner="busy")
    Execution.objects.filter(owner="busy", status="queued").update(status="running")  # the 200th runs
    with pytest.raises(OwnerLimit) as refused:
        submit("print(1)", owner="busy")
    assert (refused.value.code, refused.value.http_status) == ("owner_limit", 429)
    assert str(refused.value).startswith(OwnerLimit.text)
    submit("print(1)", owner="bystander")  # another owner is unaffected


def test_the_2001st_queued_execution_of_an_owner_is_refused_with_the_defaults():
    Owner.objects.create(name="flood")
    Owner.objects.create(name="bystander")
    _rows("flood", "queued", 1999)
    submit("print(1)", owner="flood")  # the 2,000th
    with pytest.raises(OwnerLimit):
        submit("print(1)", owner="flood")
    assert Execution.objects.filter(owner="flood", status="queued").count() == 2000
    submit("print(1)", owner="bystander")


def test_an_owner_s_own_caps_override_the_defaults():
    Owner.objects.create(name="small", max_active=2, max_queued=3)
    ids = [submit("print(1)", owner="small") for _ in range(3)]
    with pytest.raises(OwnerLimit, match="3 executions queued; its cap is 3"):
        submit("print(1)", owner="small")
    Execution.objects.filter(pk__in=ids[:2]).update(status="running")
    Execution.objects.filter(pk=ids[2]).delete()
    with pytest.raises(OwnerLimit, match="2 executions running; its cap is 2"):
        submit("print(1)", owner="small")


def test_the_live_run_cap_refuses_a_run_until_one_ends():
    Owner.objects.create(name="runner", max_live_runs=2)
    first = runs.create_run("runner", JOB)
    runs.create_run("runner", JOB)
    with pytest.raises(OwnerLimit, match="2 runs not yet ended; its cap is 2"):
        runs.create_run("runner", JOB)
    runs.cancel_run(first.id)
    runs.create_run("runner", JOB)


def test_a_full_deployment_refuses_everyone_with_at_capacity(settings):
    settings.EXECUTION_MAX_QUEUED_TOTAL = 5
    Owner.objects.create(name="big")
    Owner.objects.create(name="late")
    _rows("big", "queued", 5)
    with pytest.raises(AtCapacity) as refused:
        submit("print(1)", owner="late")
    assert (refused.value.code, refused.value.http_status) == ("at_capacity", 503)
    assert str(refused.value).startswith(AtCapacity.text)
    assert "5" not in str(refused.value)  # every owner's count together is not this owner's to read
    Execution.objects.filter(owner="big")[:1].get().delete()
    submit("print(1)", owner="late")


def test_a_flood_refused_at_capacity_logs_one_line_per_interval_with_the_count_left_out(settings, caplog, monkeypatch):
    settings.EXECUTION_MAX_QUEUED_TOTAL = 2
    Owner.objects.create(name="big")
    _rows("big", "queued", 2)
    monkeypatch.setattr(admission, "at_capacity_log", admission.Throttled(admission.log, "at_capacity", 3600))

    def refuse(n: int) -> list[dict]:
        caplog.clear()
        for _ in range(n):
            with pytest.raises(AtCapacity):
                submit("print(1)", owner="big")
        return [getattr(r, FIELDS_ATTR) for r in caplog.records if r.getMessage() == "at_capacity"]

    (first,) = refuse(50)
    assert (first["queued"], first["cap"], first["left_out"]) == (2, 2, 0)
    admission.at_capacity_log._next = 0.0  # the interval has passed
    (second,) = refuse(1)
    assert second["left_out"] == 49


@pytest.mark.django_db(transaction=True)
def test_a_submit_waiting_for_the_owner_s_lock_counts_what_the_holder_committed():
    """The seed's rule: look the owner's state up after the admission wait. A holds the
    owner's lock with its row not yet committed; B's submit waits for the lock, then
    counts A's row and is refused. Counted before the wait, both would pass the cap."""
    Owner.objects.create(name="one-slot", max_queued=1)
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                admission.admit_execution("one-slot")
                Execution.objects.create(owner="one-slot", code="x", timeout_ms=1000, memory_mb=64)
                holding.set()
                release.wait(scaled(10))
        finally:
            connection.close()

    outcome: list[object] = []

    def contender() -> None:
        try:
            outcome.append(submit("print(1)", owner="one-slot"))
        except OwnerLimit as exc:
            outcome.append(exc)
        finally:
            connection.close()

    a = threading.Thread(target=holder)
    a.start()
    assert holding.wait(scaled(10))
    b = threading.Thread(target=contender)
    b.start()
    try:
        b.join(scaled(0.5))
        waited = b.is_alive()
    finally:
        release.set()
        a.join(scaled(10))
        b.join(scaled(10))
    assert waited, "the second submit did not wait for the owner's lock"
    assert len(outcome) == 1 and isinstance(outcome[0], OwnerLimit)
    assert Execution.objects.filter(owner="one-slot").count() == 1
