"""Steering in the admin: listed on the run's page, sent from it through steering.send,
never editable after sending, refused for a run that has ended."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from controlplane.runs import actions, steering
from controlplane.runs.models import SteerMessage

pytestmark = pytest.mark.django_db

PREFIX = "steer_messages"


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    client.login(username="admin", password="pw")
    return client


def _post(admin_client, run_id: str, kind: str, body: str):
    initial = SteerMessage.objects.filter(run_id=run_id).count()
    data = {
        f"{PREFIX}-TOTAL_FORMS": str(initial + 1),
        f"{PREFIX}-INITIAL_FORMS": str(initial),
        f"{PREFIX}-MIN_NUM_FORMS": "0",
        f"{PREFIX}-MAX_NUM_FORMS": "1000",
        f"{PREFIX}-{initial}-kind": kind,
        f"{PREFIX}-{initial}-body": body,
        f"{PREFIX}-{initial}-run": run_id,
    }
    for i, message in enumerate(SteerMessage.objects.filter(run_id=run_id).order_by("created_at", "id")):
        data[f"{PREFIX}-{i}-id"] = message.id
        data[f"{PREFIX}-{i}-run"] = run_id
    return admin_client.post(f"/admin/runs/run/{run_id}/change/", data, follow=True)


def test_the_run_page_lists_its_messages_and_sends_new_ones_that_stay_read_only(admin_client, running):
    first = steering.send(running.run_id, "steer", "already sent")
    page = admin_client.get(f"/admin/runs/run/{running.run_id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "already sent" in html and "Steering" in html
    # The sent row is shown, not offered as a field.
    assert f'name="{PREFIX}-0-body"' not in html and f'name="{PREFIX}-1-body"' in html
    answer = _post(admin_client, running.run_id, "interrupt", "")
    assert answer.status_code == 200
    sent = list(SteerMessage.objects.filter(run_id=running.run_id).order_by("created_at").values_list("kind", "body"))
    assert sent == [("steer", "already sent"), ("interrupt", "")]
    assert "Sent interrupt" in answer.content.decode()
    # A post can only add: the sent row is unchanged.
    forged = _post(admin_client, running.run_id, "steer", "new one")
    assert forged.status_code == 200
    assert SteerMessage.objects.get(pk=first.pk).body == "already sent"


def test_a_run_that_has_ended_offers_no_send_and_a_forged_send_is_refused(admin_client, running):
    actions.cancel_run(running.run_id)
    page = admin_client.get(f"/admin/runs/run/{running.run_id}/change/")
    assert f'name="{PREFIX}-0-body"' not in page.content.decode()
    _post(admin_client, running.run_id, "interrupt", "")
    assert not SteerMessage.objects.filter(run_id=running.run_id).exists()
