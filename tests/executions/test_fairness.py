"""Weighted fair dispatch (controlplane/executions/dispatch.py) with a real Celery worker
and a real sandbox host: the order is the rule's, not the queue's, and an owner at its
active cap is skipped, not waited for.

The rule: owners with queued work take turns in name order; on its turn an owner
dispatches up to ``weight`` executions (its oldest first), then the turn passes on; an
owner running ``max_active`` executions is passed over."""

from __future__ import annotations

import itertools

import pytest

from controlplane.owners.models import Owner
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


def _env(host, token: str) -> dict[str, str]:
    return {"HOLDFAST_SANDBOX_URL": host.url, "HOLDFAST_SANDBOX_TOKEN": token}


def _labelled(label: str, sleep_s: float = 0.0) -> str:
    return f"import time\ntime.sleep({sleep_s})\nprint({label!r})\n"


def test_one_slot_runs_a_weight_2_owner_twice_for_each_run_of_a_weight_1_owner(sandbox_token):
    """The reference's case: one dispatch slot, owner A (weight 2) with a-1..a-3, owner B
    (weight 1) with b-1, b-2, all queued before the worker starts. They are submitted
    interleaved, B first (FIFO would give b-1, a-1, b-2, a-2, a-3); the rule gives
    exactly a-1, a-2 (A's turn of 2), b-1 (B's turn of 1), a-3, b-2."""
    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    Owner.objects.create(name="fair-a", weight=2)
    Owner.objects.create(name="fair-b", weight=1)
    ids = {}
    for label in ("b-1", "a-1", "b-2", "a-2", "a-3"):
        ids[str(submit(_labelled(label), owner=f"fair-{label[0]}", timeout_s=30))] = label
    with start_host(sandbox_token) as host, start_worker(_env(host, sandbox_token), concurrency=1):
        wait_until(
            lambda: Execution.objects.filter(pk__in=ids, status="succeeded").count() == 5,
            timeout=60,
            what="the five executions",
        )
    rows = list(Execution.objects.filter(pk__in=ids).order_by("finished_at"))
    assert [r.stdout.strip() for r in rows] == ["a-1", "a-2", "b-1", "a-3", "b-2"]
    assert [ids[str(r.pk)] for r in rows] == ["a-1", "a-2", "b-1", "a-3", "b-2"]
    assert [r.pk for r in rows] == [r.pk for r in Execution.objects.filter(pk__in=ids).order_by("started_at")]


def test_an_owner_at_its_active_cap_is_skipped_and_resumes_when_it_drops_below(sandbox_token):
    """Two slots. ``capped`` (max_active 1) queued three slow executions first; ``free``
    queued three quick ones after. ``capped`` never runs two at once, ``free`` does not
    wait behind it, and ``capped``'s rest runs as each of its executions ends (a nudge
    that found it at its cap is sent again then; no sweep runs in this test)."""
    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    Owner.objects.create(name="capped", max_active=1)
    Owner.objects.create(name="free")
    capped = [str(submit(_labelled(f"c-{i}", 3), owner="capped", timeout_s=30)) for i in range(3)]
    free = [str(submit(_labelled(f"f-{i}"), owner="free", timeout_s=30)) for i in range(3)]
    with start_host(sandbox_token) as host, start_worker(_env(host, sandbox_token), concurrency=2):
        wait_until(
            lambda: Execution.objects.filter(pk__in=capped + free, status="succeeded").count() == 6,
            timeout=90,
            what="all six executions",
        )
    c = list(Execution.objects.filter(pk__in=capped).order_by("started_at"))
    for earlier, later in itertools.pairwise(c):
        assert later.started_at >= earlier.finished_at, "the capped owner ran two at once"
    last_free = max(Execution.objects.filter(pk__in=free).values_list("finished_at", flat=True))
    assert last_free < c[1].started_at, "the free owner waited behind the capped one"
