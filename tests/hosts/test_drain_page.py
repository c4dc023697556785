"""The drain status page and the state rules behind it, fed through the real cache
(Redis) and database; no worker process here (see test_worker_publisher.py)."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.utils import timezone

from controlplane.hosts import actions, snapshots
from controlplane.hosts.models import DrainSource, SandboxHost, State
from controlplane.pool.state import ConnectionSnapshot, ConnState, RetireReason
from tests.timing import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("owners")]

URL = "/admin/hosts/sandboxhost/drain-status/"


@pytest.fixture(autouse=True)
def _clean_cache():
    cache.delete(snapshots.INDEX_KEY)
    yield
    cache.delete(snapshots.INDEX_KEY)


def conn(
    host_id: str,
    *,
    state: str = "open",
    age: float = 10.0,
    in_flight: int = 0,
    reason: str = "",
    isolation="bwrap",
    reserve=None,
) -> ConnectionSnapshot:
    return ConnectionSnapshot(host_id=host_id, url="ws://lb", state=ConnState(state),
                              retire_reason=RetireReason(reason) if reason else None, age_s=age, max_age_s=120.0,
                              in_flight=in_flight, finished=0, isolation=isolation, reserve=reserve)  # fmt: skip


def publish(worker: str, conns: list[ConnectionSnapshot], *, finished=None, interval: float = 2.0, applied=()) -> dict:
    snap = {
        "worker": worker,
        "published_at": time.time(),
        "interval_s": interval,
        "max_age_s": 120.0,
        "draining_applied": list(applied),
        "hosts": snapshots.summarize(conns, finished or {}),
    }
    snapshots.publish(snap, interval_s=interval)
    return snap


def staff(client, *, perm: bool = True) -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    if perm:
        user.user_permissions.add(Permission.objects.get(codename="view_sandboxhost"))
    client.force_login(user)
    return user


def test_anonymous_and_non_staff_users_are_sent_to_the_login_page(client):
    response = client.get(URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    client.force_login(User.objects.create_user("someone", password="pw"))
    for url in (URL, URL + "?format=json"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_without_the_hosts_view_permission_get_403(client):
    staff(client, perm=False)
    assert client.get(URL).status_code == 403


def test_the_page_shows_each_workers_connections_per_host(client):
    staff(client)
    SandboxHost.objects.create(name="h1", state=State.ACTIVE)
    publish("w1 pid=1", [conn("h1", age=50, in_flight=2), conn("h1", state="retiring", age=90, in_flight=1,
            reason="max age")], finished={"h1": 7})  # fmt: skip
    publish("w2 pid=2", [conn("h1", age=5, in_flight=0)])
    data = client.get(URL + "?format=json").json()
    (h1,) = data["hosts"]
    assert (h1["connections"], h1["retiring"], h1["in_flight"], h1["finished_recent"]) == (3, 1, 3, 7)
    assert h1["oldest_age_s"] == 90
    assert {w["worker"]: w["connections"] for w in h1["workers"]} == {"w1 pid=1": 2, "w2 pid=2": 1}
    assert 'data-host="h1"' in data["html"] and "w2 pid=2" in data["html"]
    page = client.get(URL)
    assert page.status_code == 200
    body = page.content.decode()
    assert "w1 pid=1" in body and "?format=json" in body
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", body)  # no external asset


def test_a_dead_workers_snapshot_disappears_after_its_ttl(client):
    staff(client)
    SandboxHost.objects.create(name="h1")
    publish("w-dead pid=9", [conn("h1")], interval=0.2)  # lives 3 intervals, rounded up to 1 s
    assert [s["worker"] for s in snapshots.live_snapshots()] == ["w-dead pid=9"]
    wait_until(lambda: not snapshots.live_snapshots(), timeout=5, what="the snapshot to expire")
    assert client.get(URL + "?format=json").json()["hosts"][0]["connections"] == 0


def test_the_estimate_is_max_age_left_plus_the_longest_running_execution(client):
    from controlplane.executions.models import Execution

    staff(client)
    now = timezone.now()
    SandboxHost.objects.create(name="h1", state=State.DRAINING, drained_by=DrainSource.HOST, drain_started_at=now)
    # The youngest open connection is 100 s old: it retires within 20 s (max age 120).
    publish("w1 pid=1", [conn("h1", age=100, in_flight=1), conn("h1", state="retiring", age=110, in_flight=1)])
    Execution.objects.create(owner="t", code="x", timeout_ms=30_000, memory_mb=64, status="running",
                             worker="w1 pid=1", started_at=now - timedelta(seconds=10))  # fmt: skip
    (h1,) = client.get(URL + "?format=json").json()["hosts"]
    assert 39 <= h1["empty_in_s"] <= 41  # 20 s to retire + 20 s left of the longest execution
    publish("w1 pid=1", [])
    (h1,) = client.get(URL + "?format=json").json()["hosts"]
    assert h1["empty_in_s"] == 0


def test_a_host_that_said_draining_is_marked_draining_and_comes_back_when_restarted():
    row = SandboxHost.objects.create(name="h1")
    hosts = snapshots.summarize([conn("h1", state="closed", reason="host draining")], {})
    actions.observe("w1", hosts)
    row.refresh_from_db()
    assert (row.state, row.drained_by) == (State.DRAINING, DrainSource.HOST)
    # An open connection opened before the drain began is the old process: still draining.
    actions.observe("w1", snapshots.summarize([conn("h1", age=3600)], {}))
    assert SandboxHost.objects.get(pk=row.pk).state == State.DRAINING
    # A fresh one means a new process under the same id.
    actions.observe("w1", snapshots.summarize([conn("h1", age=0.1)], {}), now=timezone.now() + timedelta(seconds=1))
    assert SandboxHost.objects.get(pk=row.pk).state == State.ACTIVE


def test_an_operator_drain_sticks_and_is_what_pools_apply():
    row = SandboxHost.objects.create(name="h1", address="ws://10.0.0.1:8765")
    # A host that drains on its own is not pushed to the pools: it clears itself on return.
    SandboxHost.objects.create(name="h2", state=State.DRAINING, drained_by=DrainSource.HOST, address="ws://h2")
    assert actions.drain(row)
    assert actions.operator_drains() == ({"h1"}, {"ws://10.0.0.1:8765"})
    actions.observe("w1", snapshots.summarize([conn("h1", age=0.1)], {}), now=timezone.now() + timedelta(seconds=1))
    assert SandboxHost.objects.get(pk=row.pk).state == State.DRAINING


def test_a_draining_host_nobody_holds_becomes_gone_but_one_still_seen_does_not(settings):
    settings.HOSTS_GONE_AFTER_S = 5
    old = timezone.now() - timedelta(seconds=60)
    unseen = SandboxHost.objects.create(name="a", state=State.DRAINING, drain_started_at=old, last_seen_at=old)
    seen = SandboxHost.objects.create(name="b", state=State.DRAINING, drain_started_at=old, last_seen_at=timezone.now())
    assert actions.sweep_gone() == 1
    assert SandboxHost.objects.get(pk=unseen.pk).state == State.GONE
    assert SandboxHost.objects.get(pk=seen.pk).state == State.DRAINING


def test_workers_register_hosts_they_hold_connections_to():
    actions.observe("w1 pid=1", snapshots.summarize([conn("fresh-host")], {}))
    row = SandboxHost.objects.get(name="fresh-host")
    assert row.host_id == "fresh-host" and row.last_seen_at is not None and "w1 pid=1" in row.notes


def test_the_page_shows_live_runs_per_host_and_a_host_silent_to_reconcile_probes(client):
    """Reconcile leaves a silent host's runs untouched, so its silence shows here, next to
    how many live runs each host still holds (a draining host keeps its run sandboxes)."""
    from controlplane.hosts import probe_log
    from controlplane.runs import reconcile
    from tests.reconcile.conftest import running_on
    from tests.reconcile.fake_driver import FakeProbeDriverForInterleavings

    cache.delete(probe_log.KEY)
    staff(client)
    SandboxHost.objects.create(name="h1", host_id="h1", state=State.DRAINING, drained_by=DrainSource.OPERATOR)
    on_h1 = [running_on("h1") for _ in range(2)]
    running_on("h-quiet")
    driver = FakeProbeDriverForInterleavings({"h1": {p.run_id: "running" for p in on_h1}}, silent=("h-quiet",))
    assert reconcile.tick(driver=driver).silent_hosts == ["h-quiet"]

    data = client.get(URL + "?format=json").json()
    hosts = {h["name"]: h for h in data["hosts"]}
    assert hosts["h1"]["live_runs"] == 2 and hosts["h1"]["probe_silent_since"] is None
    assert hosts["h1"]["probe_last_answer_at"] is not None
    quiet = hosts["h-quiet"]
    assert quiet["live_runs"] == 1 and quiet["registered"] is False and quiet["probe_silent_since"] is not None
    assert 'data-field="live_runs"' in data["html"] and "silent for" in data["html"]
    cache.delete(probe_log.KEY)


def test_the_page_and_the_admin_show_each_hosts_isolation(client):
    staff(client)
    publish("w1 pid=1", [conn("h1"), conn("h2", isolation="insecure-shared-uid")])
    data = client.get(URL + "?format=json").json()
    assert {h["name"]: h["isolation"] for h in data["hosts"]} == {"h1": "bwrap", "h2": "insecure-shared-uid"}
    assert 'data-field="isolation" class="hf-warn">insecure-shared-uid' in data["html"]
    # The worker's publish records it on the host's row, which the admin lists.
    actions.observe("w1 pid=1", snapshots.summarize([conn("h1"), conn("h2", isolation="insecure-shared-uid")], {}))
    assert dict(SandboxHost.objects.values_list("name", "isolation")) == {"h1": "bwrap", "h2": "insecure-shared-uid"}
    client.force_login(User.objects.create_superuser("admin", password="pw"))
    assert "insecure-shared-uid" in client.get("/admin/hosts/sandboxhost/").content.decode()


def test_the_page_shows_how_many_sandboxes_each_host_keeps_prepared(client):
    staff(client)
    publish("w1 pid=1", [conn("h1", reserve=4), conn("h2")])
    data = client.get(URL + "?format=json").json()
    assert {h["name"]: h["reserve"] for h in data["hosts"]} == {"h1": 4, "h2": None}
    assert '<dd data-field="reserve">4</dd>' in data["html"]


def test_the_page_shows_each_owners_active_queued_and_last_minute_rate(client):
    from controlplane.executions.models import Execution
    from controlplane.owners.models import Owner

    staff(client)
    Owner.objects.create(name="busy", weight=3, max_active=2)
    now = timezone.now()

    def rows(owner, status, n, **fields):
        Execution.objects.bulk_create(
            Execution(owner=owner, code="x", timeout_ms=1000, memory_mb=64, status=status, **fields) for _ in range(n)
        )

    rows("busy", "running", 2)
    rows("busy", "queued", 5)
    rows("busy", "succeeded", 4, finished_at=now - timedelta(seconds=10))
    rows("t", "succeeded", 1, finished_at=now - timedelta(minutes=5))  # outside the minute
    Execution.objects.filter(owner="t").update(created_at=now - timedelta(minutes=6))
    data = client.get(URL + "?format=json").json()
    assert data["owners"] == [
        {"name": "busy", "weight": 3, "active": 2, "queued": 5, "submitted_last_minute": 11,
         "finished_last_minute": 4, "max_active": 2, "max_queued": 2000},
    ]  # fmt: skip
    assert 'data-owner="busy"' in data["html"] and "at its cap" in data["html"]
