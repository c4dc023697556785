"""Idempotency-Key: a retried creating POST answers with the first one's resource and
creates nothing; the same key with another request is refused; keys are per owner; a
refused POST leaves no record; records expire. The retry over a real connection cut
mid-answer is in test_cut_response.py."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.api import idempotency
from controlplane.api.models import IdempotencyRecord
from controlplane.api.tasks import purge_idempotency_records
from controlplane.executions.models import Execution
from controlplane.owners import errors as owner_errors
from controlplane.runs.models import Run

from .conftest import JOB, RUN_SECRET, error, make_api

BODY = {"code": "print(1)", "timeout_s": 5}


def _post(api, body=BODY, key="retry-1", path="/executions"):
    return api.post(path, body, headers={"Idempotency-Key": key} if key is not None else None)


@pytest.mark.django_db
def test_a_retried_post_returns_the_first_execution_and_creates_no_second(api):
    first = _post(api)
    again = _post(api)
    assert first.status_code == again.status_code == 202
    assert json.loads(again.body)["id"] == json.loads(first.body)["id"]
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Execution.objects.count() == 1


@pytest.mark.django_db
def test_a_retry_may_change_whether_it_waits(api, settings):
    settings.API_EXECUTION_WAIT_MAX_S = 0.1
    first = json.loads(_post(api).body)
    again = json.loads(_post(api, {**BODY, "wait": True}).body)
    assert again["id"] == first["id"] and Execution.objects.count() == 1


@pytest.mark.django_db
def test_without_a_key_every_post_creates(api):
    _post(api, key=None)
    _post(api, key=None)
    assert Execution.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("second_path", "second_body"),
    [("/executions", {**BODY, "code": "print(2)"}), ("/executions", {"code": "print(1)"}), ("/runs", {"job": JOB})],
)
def test_the_same_key_for_another_request_is_refused(api, second_path, second_body):
    _post(api)
    answer = _post(api, second_body, path=second_path)
    assert answer.status_code == 422
    assert error(answer) == {
        "code": "idempotency_key_reused",
        "message": "this Idempotency-Key was already used for a different request",
        "field": "Idempotency-Key",
    }
    assert Execution.objects.count() == 1 and Run.objects.count() == 0


@pytest.mark.django_db
def test_keys_are_per_owner(api, other):
    mine = json.loads(_post(api).body)["id"]
    theirs = json.loads(_post(other).body)["id"]
    assert mine != theirs
    assert set(Execution.objects.values_list("owner", flat=True)) == {"acme", "globex"}


@pytest.mark.django_db
def test_a_refused_post_leaves_no_record_and_its_retry_creates(api, monkeypatch):
    from controlplane.executions import api as executions_api

    real_submit = executions_api.submit

    def over_cap_once(*args, **kwargs):  # a stand-in for admission refusing once
        monkeypatch.setattr(executions_api, "submit", real_submit)
        raise owner_errors.OwnerLimit("queued 2000 of 2000")

    monkeypatch.setattr(executions_api, "submit", over_cap_once)
    assert _post(api).status_code == 429
    assert IdempotencyRecord.objects.count() == 0
    retry = _post(api)
    assert retry.status_code == 202 and "Idempotent-Replayed" not in retry
    assert Execution.objects.count() == 1


@pytest.mark.django_db
def test_an_expired_key_creates_anew_and_the_purge_deletes_old_records(api, settings):
    first = json.loads(_post(api).body)["id"]
    old = timezone.now() - timedelta(seconds=settings.API_IDEMPOTENCY_RETENTION_S + 1)
    IdempotencyRecord.objects.update(created_at=old)
    second = json.loads(_post(api).body)["id"]
    assert second != first and Execution.objects.count() == 2
    _post(api, key="retry-2")
    IdempotencyRecord.objects.filter(key="retry-2").update(created_at=old)
    assert purge_idempotency_records() == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["retry-1"]


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "two words"])
def test_a_malformed_key_is_a_400(api, key):
    answer = _post(api, key=key)
    assert answer.status_code == 400 and error(answer)["field"] == "Idempotency-Key"
    assert Execution.objects.count() == 0


@pytest.mark.django_db
def test_a_retried_run_post_returns_the_first_run(api):
    body = {"job": JOB, "secrets": {"TOKEN": RUN_SECRET}}
    first = _post(api, body, path="/runs")
    again = _post(api, body, path="/runs")
    assert (first.status_code, again.status_code) == (202, 202)
    assert json.loads(again.body)["id"] == json.loads(first.body)["id"] and Run.objects.count() == 1
    changed = _post(api, {"job": JOB, "secrets": {"TOKEN": "another"}}, path="/runs")
    assert changed.status_code == 422 and Run.objects.count() == 1


def test_the_fingerprint_keeps_no_secret_in_the_clear(settings):
    digest = idempotency.fingerprint("POST /runs", {"secrets": {"TOKEN": RUN_SECRET}})
    assert RUN_SECRET not in digest and len(digest) == 64
    # Keyed with the deployment's secret: a plain hash of a guessable secret would let
    # whoever reads the table try candidates against it.
    settings.SECRET_KEY = "another-deployment-secret-key-0123456789abcdef"
    assert idempotency.fingerprint("POST /runs", {"secrets": {"TOKEN": RUN_SECRET}}) != digest


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_posts_with_one_key_create_one_execution():
    api = make_api("acme")
    barrier = threading.Barrier(2)
    answers = []

    def post() -> None:
        try:
            barrier.wait()
            answers.append(_post(api))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [202, 202]
    assert len({json.loads(a.body)["id"] for a in answers}) == 1
    assert Execution.objects.count() == 1
