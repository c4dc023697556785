"""One owner's flood does not bury another owner's work (issue 13): owner A submits
2,000 executions, then owner B submits 20; with a real worker and a real host, all of
B's finish while most of A's are still queued. Under the old FIFO dispatch, B's 20
would run only after A's 2,000."""

from __future__ import annotations

import pytest

from controlplane.owners.models import Owner
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FLOOD = 2000
OTHER = 20


def test_a_flood_of_one_owner_leaves_another_owner_s_work_prompt(sandbox_token):
    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    Owner.objects.create(name="flood-a")
    Owner.objects.create(name="flood-b")
    with start_host(sandbox_token) as host:
        env = {"HOLDFAST_SANDBOX_URL": host.url, "HOLDFAST_SANDBOX_TOKEN": sandbox_token}
        # A's flood is queued first (submitting is slower than running on a loaded
        # machine, so with the worker already up A would never have a backlog).
        for _ in range(FLOOD):
            submit("print('a')", owner="flood-a", timeout_s=30)
        with start_worker(env, concurrency=4):
            b_ids = [str(submit("print('b')", owner="flood-b", timeout_s=30)) for _ in range(OTHER)]
            a_done_when_b_submitted = Execution.objects.filter(owner="flood-a").exclude(status="queued").count()
            wait_until(
                lambda: Execution.objects.filter(pk__in=b_ids, status="succeeded").count() == OTHER,
                timeout=120,
                what="owner B's executions",
            )
            a_left = Execution.objects.filter(owner="flood-a", status="queued").count()
            # Stop the flood: what is still queued is cancelled, in-flight work finishes.
            Execution.objects.filter(owner="flood-a", status="queued").update(status="cancelled")
        _drop_spare_nudges()
    print(f"\n[flood] A done when B submitted: {a_done_when_b_submitted}; A still queued when B finished: {a_left}")
    assert a_left > FLOOD // 2, (a_done_when_b_submitted, a_left)
    # B's work was dispatched among A's, not behind them: A dispatched at most about
    # as many as B (equal weights) between B's submission and B's last finish.
    a_dispatched_meanwhile = FLOOD - a_left - a_done_when_b_submitted
    assert a_dispatched_meanwhile <= OTHER + 8, (a_done_when_b_submitted, a_left)


def _drop_spare_nudges() -> None:
    """The cancelled rows' messages would only be no-ops for the next test's worker."""
    from django.conf import settings

    if settings.CELERY_BROKER_URL.startswith("redis://"):
        import redis

        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)
