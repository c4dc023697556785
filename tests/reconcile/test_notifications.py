"""Issue 9, test 7: the callback receiver (a real local HTTP server) sees exactly one
signed notification per terminal transition, also when it answers 500 twice first.
A real Celery worker delivers them; real PostgreSQL and Redis."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from controlplane.runs import actions, notifications, reconcile
from controlplane.runs.models import Run, RunNotification, RunStatus
from controlplane.runs.tasks import deliver_notification
from tests.runs.conftest import JOB, RunnerCalls
from tests.support.worker import start_worker
from tests.timing import wait_until

from .fake_driver import FakeProbeDriverForInterleavings
from .receiver import start_receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.peer]


@pytest.fixture
def worker():
    env = {"HOLDFAST_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE, "HOLDFAST_NOTIFY_RETRY_BASE_S": "0.2"}
    with start_worker(env, concurrency=2) as process:
        yield process


def _verified(received, owner: str) -> dict:
    secret = notifications.owner_secret(owner)
    assert notifications.verify(secret, received.body, received.headers[notifications.SIGNATURE_HEADER])
    assert not notifications.verify(secret, received.body + b" ", received.headers[notifications.SIGNATURE_HEADER])
    return json.loads(received.body)


def test_each_terminal_transition_is_notified_once_signed_even_after_two_500s(worker):
    with start_receiver(fail_first=2) as receiver:
        # A runner's verdict (succeeded), an operator's cancel, and reconcile's failure.
        done = actions.create_run("acme", JOB, callback_url=receiver.url)
        claim = actions.claim_for_launch(done.id)
        calls = RunnerCalls(Client(), str(done.id))
        calls.token = calls.post("hello", {"instance_id": "i-1"}, token=claim.launch_key).json()["session_token"]
        assert calls.post("result", {"status": "succeeded", "exit_code": 0, "error": ""}).status_code == 200

        cancelled = actions.create_run("acme", JOB, callback_url=receiver.url)
        assert actions.cancel_run(cancelled.id) is True
        assert actions.cancel_run(cancelled.id) is False  # a lost claim sends nothing

        lost = actions.create_run("globex", JOB, callback_url=receiver.url)
        actions.claim_for_launch(lost.id)
        Run.objects.filter(pk=lost.id).update(host_id="h")
        driver = FakeProbeDriverForInterleavings({"h": {str(lost.id): "unknown"}})
        reconcile.tick(driver=driver)
        later = timezone.now() + timedelta(seconds=settings.SANDBOX_LOSS_GRACE_S + 1)
        assert reconcile.tick(now=later, driver=driver).failed["sandbox_lost"] == [str(lost.id)]

        wait_until(lambda: len(receiver.accepted()) == 3, timeout=60, what="three accepted notifications")
        # A redelivered task for a delivered notification sends nothing more.
        for notification in RunNotification.objects.all():
            deliver_notification.delay(notification.id)
        wait_until(
            lambda: RunNotification.objects.filter(delivered_at__isnull=True).count() == 0, timeout=30, what="rows"
        )
        time.sleep(1.0)  # give a wrong duplicate the time to arrive
        accepted = receiver.accepted()
        # Each notification: 500, 500, then one 200; nothing after its 200.
        assert len(receiver.all()) == 9, [r.answered for r in receiver.all()]
        assert len(accepted) == 3
        bodies = {(b["run_id"], b["status"]): b for b in (_verified(r, json.loads(r.body)["owner"]) for r in accepted)}
        assert set(bodies) == {
            (str(done.id), RunStatus.SUCCEEDED),
            (str(cancelled.id), RunStatus.CANCELLED),
            (str(lost.id), RunStatus.FAILED),
        }
        assert bodies[(str(lost.id), RunStatus.FAILED)]["error"].startswith("sandbox_lost")
        for r in accepted:
            body = json.loads(r.body)
            assert r.headers[notifications.ID_HEADER] == f"{body['run_id']}:{body['status']}"
        assert sorted(receiver.seen_ids.values()) == [3, 3, 3]
        # Each needed three attempts (500, 500, 200), counted on its row.
        assert sorted(RunNotification.objects.values_list("attempts", flat=True)) == [3, 3, 3]


def test_a_redirect_is_not_followed_and_counts_as_a_failed_attempt(settings):
    """urllib would turn the POST into a GET to wherever the receiver points."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        run = actions.create_run("acme", JOB, callback_url=f"http://127.0.0.1:{server.server_address[1]}/hook")
        actions.cancel_run(run.id)
        notification = RunNotification.objects.get(run=run)
        attempt = notifications.deliver(notification.id)
        assert attempt.sent and not attempt.delivered and attempt.retry_in_s is not None
        notification.refresh_from_db()
        assert notification.last_error == "HTTP 302" and notification.delivered_at is None
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        # No worker here: drop the message the cancel published, for later tests' workers.
        import redis

        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)
