"""Reconcile's compare-and-set guards, with the injected probe forcing each interleaving
(issue 9, tests 1 to 4). Real PostgreSQL; the probe driver is the named fake only
because a real host cannot be made to answer while a row is changed under the tick."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from controlplane.runs import reconcile
from controlplane.runs.models import Run, RunEvent, RunNotification

from .conftest import HOST, assert_failed_once_as_lost, assert_still_running_with_keys, running_on
from .fake_driver import FakeProbeDriverForInterleavings

GRACE = timedelta(seconds=settings.SANDBOX_LOSS_GRACE_S)


def lost(placed) -> FakeProbeDriverForInterleavings:
    return FakeProbeDriverForInterleavings({HOST: {placed.run_id: "exited"}})


# --- test 1 -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_stamp_cleared_by_another_tick_while_the_probe_is_in_flight_keeps_the_run_running():
    """Tick A read a stamp older than the grace; while its probe is in flight tick B sees
    the sandbox alive and clears the stamp. A's probe then says exited, but A's failure
    compare-and-sets against the stamp it read, so it claims nothing: the run keeps
    running with its keys. (Red without the stamp guard on the failure.)"""
    now = timezone.now()
    placed = running_on(stamp=now - GRACE - timedelta(seconds=30))

    def tick_b_sees_it_alive() -> None:
        alive = FakeProbeDriverForInterleavings({HOST: {placed.run_id: "running"}})
        report_b = reconcile.tick(now=now, driver=alive)
        assert report_b.cleared == [placed.run_id]

    driver = FakeProbeDriverForInterleavings({HOST: {placed.run_id: "exited"}}, during=tick_b_sees_it_alive)
    report = reconcile.tick(now=now, driver=driver)

    assert report.failed.get("sandbox_lost", []) == [] and report.lost_races == 1
    assert_still_running_with_keys(placed)
    assert placed.row().loss_observed_at is None


# --- test 2 -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_stamp_written_after_this_tick_read_the_row_survives_its_stale_clear():
    """Tick A read stamp S1; while its probe is in flight the row gets a newer stamp S2
    (B cleared S1 on an alive probe, C stamped a fresh loss). A's probe says running:
    its clear compare-and-sets against S1 and must leave S2 alone. (Red without it.)"""
    now = timezone.now()
    first = now - timedelta(seconds=10)
    newer = now - timedelta(seconds=2)
    placed = running_on(stamp=first)

    def another_tick_stamps_a_fresh_loss() -> None:
        Run.objects.filter(pk=placed.run_id).update(loss_observed_at=newer)

    driver = FakeProbeDriverForInterleavings(
        {HOST: {placed.run_id: "running"}}, during=another_tick_stamps_a_fresh_loss
    )
    report = reconcile.tick(now=now, driver=driver)

    assert report.cleared == [] and report.lost_races == 1
    assert placed.row().loss_observed_at == newer


@pytest.mark.django_db
def test_a_stale_first_observation_cannot_move_the_loss_window_later():
    """Tick A read no stamp; while its probe is in flight tick B stamps the loss at t0.
    A's stamp compare-and-sets against NULL, so the window stays at t0 (a later stamp
    would postpone the failure). (Red without the IS NULL guard.)"""
    now = timezone.now()
    earlier = now - timedelta(seconds=20)
    placed = running_on()

    def tick_b_stamps_first() -> None:
        assert reconcile.tick(now=earlier, driver=lost(placed)).stamped == [placed.run_id]

    driver = FakeProbeDriverForInterleavings({HOST: {placed.run_id: "exited"}}, during=tick_b_stamps_first)
    report = reconcile.tick(now=now, driver=driver)
    assert report.stamped == [] and report.lost_races == 1
    assert placed.row().loss_observed_at == earlier


# --- test 3 -------------------------------------------------------------------------


@pytest.mark.django_db
def test_lost_for_less_than_the_grace_is_not_failed_and_past_it_is_failed_once():
    start = timezone.now()
    placed = running_on()

    first = reconcile.tick(now=start, driver=lost(placed))
    assert first.stamped == [placed.run_id]
    assert placed.row().loss_observed_at == start

    inside = reconcile.tick(now=start + GRACE - timedelta(seconds=1), driver=lost(placed))
    assert inside.waiting == [placed.run_id] and not inside.failed
    assert_still_running_with_keys(placed)

    past = reconcile.tick(now=start + GRACE + timedelta(seconds=1), driver=lost(placed))
    assert past.failed["sandbox_lost"] == [placed.run_id]
    assert_failed_once_as_lost(placed)

    # A later tick finds nothing live to probe: no second claim, no second notification.
    again = reconcile.tick(now=start + GRACE * 3, driver=lost(placed))
    assert again.probed == {} and not again.failed
    assert_failed_once_as_lost(placed)


@pytest.mark.django_db
def test_a_stamp_in_the_future_is_replaced_never_taken_as_proof():
    now = timezone.now()
    placed = running_on(stamp=now + timedelta(days=365))
    report = reconcile.tick(now=now, driver=lost(placed))
    assert report.stamped == [placed.run_id] and not report.failed
    assert placed.row().loss_observed_at == now
    assert_still_running_with_keys(placed)


@pytest.mark.django_db(transaction=True)
def test_two_overlapping_ticks_make_exactly_one_claim_and_one_notification():
    """Two ticks read the same stamp (past the grace), both probes answer exited, and
    both try to fail the run at the same moment, each in its own thread and database
    connection. The claim's compare-and-set on the live status lets exactly one win."""
    now = timezone.now()
    placed = running_on(stamp=now - GRACE - timedelta(seconds=5))
    both_probing = threading.Barrier(2, timeout=30)
    reports: list[reconcile.TickReport] = []
    errors: list[BaseException] = []

    def one_tick() -> None:
        try:
            driver = FakeProbeDriverForInterleavings({HOST: {placed.run_id: "exited"}}, during=both_probing.wait)
            reports.append(reconcile.tick(now=now, driver=driver))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_tick) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    claims = [run_id for report in reports for run_id in report.failed.get("sandbox_lost", [])]
    assert claims == [placed.run_id]
    assert sum(report.lost_races for report in reports) == 1
    assert_failed_once_as_lost(placed)
    assert RunEvent.objects.filter(run_id=placed.run_id, type="result").count() == 1
    assert RunNotification.objects.filter(run_id=placed.run_id).count() == 1


# --- test 4 (the injected half; the silent host is tests/reconcile/test_hosts.py) -----


@pytest.mark.django_db
def test_a_sandbox_back_inside_the_grace_has_its_stamp_cleared():
    now = timezone.now()
    placed = running_on(stamp=now - GRACE / 2)
    report = reconcile.tick(now=now, driver=FakeProbeDriverForInterleavings({HOST: {placed.run_id: "running"}}))
    assert report.cleared == [placed.run_id] and report.alive == 1
    assert placed.row().loss_observed_at is None
    assert_still_running_with_keys(placed)


@pytest.mark.django_db
def test_a_host_that_does_not_answer_leaves_its_runs_untouched():
    now = timezone.now()
    fresh = running_on()
    old = running_on(stamp=now - GRACE * 2)
    driver = FakeProbeDriverForInterleavings({}, silent=(HOST,))
    report = reconcile.tick(now=now, driver=driver)
    assert report.silent_hosts == [HOST] and not report.stamped and not report.failed
    assert fresh.row().loss_observed_at is None
    assert old.row().loss_observed_at == now - GRACE * 2
    assert_still_running_with_keys(old)


@pytest.mark.django_db
def test_one_probe_per_host_per_tick_for_all_its_runs():
    runs_a = [running_on("host-a") for _ in range(3)]
    runs_b = [running_on("host-b") for _ in range(2)]
    answers = {"host-a": {p.run_id: "running" for p in runs_a}, "host-b": {p.run_id: "running" for p in runs_b}}
    driver = FakeProbeDriverForInterleavings(answers)
    reconcile.tick(driver=driver)
    assert len(driver.calls) == 1
    assert {h: sorted(ids) for h, ids in driver.calls[0].items()} == {
        "host-a": sorted(p.run_id for p in runs_a),
        "host-b": sorted(p.run_id for p in runs_b),
    }


@pytest.mark.django_db
def test_a_prober_that_breaks_leaves_every_run_untouched_and_deadlines_still_apply():
    class BrokenProber:
        def probe(self, run_ids_by_host):
            raise RuntimeError("a bug in a driver")

    now = timezone.now()
    placed = running_on(stamp=now - GRACE * 2)
    queued = reconcile.Run.objects.create(owner="acme", job={"kind": "shell", "command": "true"}, token_salt="s")
    later = now + timedelta(seconds=settings.RUN_LAUNCH_DEADLINE_S + 1)
    report = reconcile.tick(now=later, driver=BrokenProber())
    assert report.silent_hosts == [HOST] and not report.failed
    assert_still_running_with_keys(placed)
    assert report.relaunched == [str(queued.id)]
