"""manage.py show_run and cancel_run, as an operator uses them."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from controlplane.runs.models import Run, RunStatus

from .conftest import SECRET

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_show_run_prints_status_result_and_events_in_order_without_secrets(running):
    running.events("b1", "stdout", "stderr")
    running.post("result", {"status": "succeeded", "exit_code": 0})
    shown = _run("show_run", running.run_id)
    assert "status    succeeded" in shown and "(verified," in shown
    lines = [line.split()[0] for line in shown.split("events\n", 1)[1].splitlines()]
    assert lines == ["1", "2", "3"]
    assert SECRET not in shown and running.token not in shown


def test_cancel_run_cancels_once(running):
    assert "cancelled" in _run("cancel_run", running.run_id)
    assert Run.objects.get(pk=running.run_id).status == RunStatus.CANCELLED
    assert "already cancelled" in _run("cancel_run", running.run_id)


def test_commands_refuse_unknown_runs():
    for command in ("show_run", "cancel_run"):
        with pytest.raises(CommandError):
            call_command(command, "nope")


def test_create_run_refuses_a_bad_secret_name(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(CommandError):
        call_command("create_run", "--owner", "o", "--shell", "x", "--secret", "1BAD=v", stdout=io.StringIO())
    assert Run.objects.count() == 0 and callbacks == []
