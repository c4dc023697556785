"""Steering: an operator's or a service's message or interrupt for a live run.

Sending (``send``) commits a ``SteerMessage`` and, on PostgreSQL, a ``NOTIFY`` on
``STEER_CHANNEL`` carrying the run id in the same transaction, so a parked poll is
woken exactly when the row is visible (controlplane/pghub.py).

Serving (``serve``) is the runner's poll (docs/runner-api.md, "steer"):

- It first applies the acknowledgement the poll carries: ``ack`` (ids the runner acted
  on: marked delivered) and ``undeliverable`` (steers the runner gave up on: ended).
  Both are refused whole (``BadAck``, nothing marked) unless every id has the shape
  ``new_steer_id`` makes, belongs to this run, and at most ``RUNS_STEER_ACK_MAX`` are
  given; an interrupt can never be reported undeliverable.
- Then it selects the pending messages, oldest first, and counts the serve in
  ``attempts``. Fetching marks nothing: a response lost on the wire is served again.
- A poll without ``ack`` is a runner of the previous release, which sent only the old
  ``after_id`` cursor (or nothing on its first poll): it gets mark-on-select, the old
  behaviour, so it cannot be handed the same row forever. REMOVABLE once no sandbox
  launched before this route shipped can still be polling (the longest run timeout,
  ``RUNS_MAX_TIMEOUT_S``, after the deploy that shipped it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane import pgnotify

from .errors import BadAck, BadRequest, RunNotFound, RunTerminal, TooLarge
from .models import Run, SteerMessage

# The one NOTIFY channel every web process listens on; the payload is the run id.
STEER_CHANNEL = "holdfast_steer"
STEER_ID_RE = re.compile(r"^sm_[0-9a-f]{32}\Z")


# --- sending --------------------------------------------------------------------------


def send(run_id: object, kind: str, body: str = "") -> SteerMessage:
    """Queue ``kind`` (steer | interrupt) for a live run; ``RunTerminal`` when it has ended,
    ``RunNotFound`` when there is no such run. The runner's next poll gets it."""
    if kind not in SteerMessage.Kind.values:
        raise BadRequest("kind must be steer or interrupt")
    if kind == SteerMessage.Kind.STEER and not body:
        raise BadRequest("a steering message needs a body")
    if len(body.encode("utf-8")) > settings.RUNS_STEER_MAX_BODY_BYTES:
        raise TooLarge(settings.RUNS_STEER_MAX_BODY_BYTES, "message body")
    if "\x00" in body:
        raise BadRequest("body must not contain NUL characters")
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound()
        if run.is_terminal:
            raise RunTerminal(run.status)
        message = SteerMessage.objects.create(run=run, kind=kind, body=body)
        notify(run.id)
    return message


def notify(run_id: object) -> None:
    """Wake the polls parked for ``run_id`` once the current transaction commits
    (PostgreSQL delivers NOTIFY at commit). A no-op on SQLite: its polls are short."""
    if pgnotify.enabled():
        pgnotify.send(STEER_CHANNEL, str(run_id))


# --- serving the runner's poll --------------------------------------------------------


@dataclass(frozen=True)
class Poll:
    """A poll's parsed query. ``ack`` is None for a previous-release poll (no ``ack``)."""

    ack: tuple[str, ...] | None
    undeliverable: tuple[str, ...]
    after_id: str | None

    @property
    def legacy(self) -> bool:
        return self.ack is None


def _ids(values: list[str]) -> tuple[str, ...]:
    ids: list[str] = []
    for value in values:
        ids.extend(part for part in value.split(",") if part)
    return tuple(ids)


def parse_poll(query: dict[str, list[str]]) -> Poll:
    """``ack`` and ``undeliverable``: comma-separated ids (the parameter may repeat);
    ``after_id``: the previous release's cursor. Shapes and bounds are checked here."""
    ack = _ids(query["ack"]) if "ack" in query else None
    undeliverable = _ids(query.get("undeliverable", []))
    after = query.get("after_id") or []
    after_id = after[-1] if after and after[-1] else None
    given = list(ack or ()) + list(undeliverable) + ([after_id] if after_id else [])
    if len(list(ack or ()) + list(undeliverable)) > settings.RUNS_STEER_ACK_MAX:
        raise BadAck(f"at most {settings.RUNS_STEER_ACK_MAX} ids per acknowledgement")
    if any(not STEER_ID_RE.match(i) for i in given):
        raise BadAck()
    return Poll(ack, undeliverable, after_id)


def serve(run: Run, poll: Poll) -> list[dict]:
    """Apply ``poll``'s acknowledgement, then return the run's pending messages."""
    if poll.legacy:
        return _serve_legacy(run, poll)
    with transaction.atomic():
        _apply_ack(run, poll)
        return _pending(run, mark_delivered=False)


def pending_for(run_id: object) -> list[dict]:
    """After a parked poll wakes: the run's pending messages (``RunTerminal`` if it ended
    while the poll was parked, so the runner's loop ends)."""
    run = Run.objects.filter(pk=run_id).only("id", "status").first()
    if run is None:
        raise RunNotFound()
    if run.is_terminal:
        raise RunTerminal(run.status)
    with transaction.atomic():
        return _pending(run, mark_delivered=False)


def _apply_ack(run: Run, poll: Poll) -> None:
    ack = set(poll.ack or ())
    dropped = set(poll.undeliverable)
    wanted = ack | dropped
    if not wanted:
        return
    rows = dict(SteerMessage.objects.filter(run=run, id__in=wanted).values_list("id", "kind"))
    # Another run's id, or one never issued, refuses the whole acknowledgement.
    if len(rows) != len(wanted):
        raise BadAck()
    # An operator's stop is never given up on: it stays pending for the life of the run.
    if any(rows[i] == SteerMessage.Kind.INTERRUPT for i in dropped):
        raise BadAck("an interrupt cannot be reported undeliverable")
    now = timezone.now()
    live = SteerMessage.objects.filter(run=run, delivered_at__isnull=True, ended="")
    if ack:
        live.filter(id__in=ack).update(delivered_at=now)
    if dropped - ack:
        live.filter(id__in=dropped - ack).update(ended=SteerMessage.Ended.UNDELIVERABLE, ended_at=now)


def _pending(run: Run, *, mark_delivered: bool) -> list[dict]:
    rows = list(
        SteerMessage.objects.filter(run=run, delivered_at__isnull=True, ended="")
        .order_by("created_at", "id")
        .values("id", "kind", "body")[: settings.RUNS_STEER_BATCH_MAX]
    )
    if rows:
        update: dict = {"attempts": F("attempts") + 1}
        if mark_delivered:
            update["delivered_at"] = timezone.now()
        SteerMessage.objects.filter(id__in=[r["id"] for r in rows]).update(**update)
    return rows


def _serve_legacy(run: Run, poll: Poll) -> list[dict]:
    # REMOVABLE (see the module docstring): mark-on-select for a runner that cannot ack.
    if poll.after_id is not None and not SteerMessage.objects.filter(run=run, id=poll.after_id).exists():
        raise BadAck()
    with transaction.atomic():
        return _pending(run, mark_delivered=True)
