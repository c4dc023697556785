"""State changes of an Execution. Every transition is a compare-and-set on the status,
so a redelivered Celery message, a late result and an operator's cancel cannot
overwrite each other. The claim (queued -> running) is made by the fair dispatcher
(dispatch.py), which picks the row; admission (controlplane/owners/admission.py)
guards creation."""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.executions import dispatch, enqueue, notify
from controlplane.executions.models import DispatchTurn, Execution, Status
from controlplane.owners import admission
from controlplane.pool.outcome import CANCELLED, WORKER_LOST, Outcome
from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.executions")

# finish() on PostgreSQL (_finish_in_one_statement), built once (_finish_sql). Only
# quoted names are put in; every value is a parameter.
#
# Its UPDATE: what ``rows.update(**values)`` would send, for a row running or swept as
# lost (finish's docstring).
FINISH_UPDATE_SQL = (
    "UPDATE {table} SET {sets}, {attempts} = {attempts} + %s "
    "WHERE {id} = %s AND ({status} = %s OR ({status} = %s AND {error} = %s))"
)
# The whole statement. The turn row is locked whether or not a nudge is parked, and the
# release reads the count from that lock, not from the statement's snapshot. A claim
# parks under the same lock: one that holds it now is waited for and its park is seen;
# one that comes after waits for this commit and sees the slot free. Without it, a
# claim parking while this statement commits left a nudge parked beside a free slot
# until the sweep.
FINISH_SQL = (
    "WITH done AS ({update} RETURNING {returning}), "
    "turn_now AS (SELECT id, parked FROM {turn} WHERE id = 1 AND EXISTS (SELECT 1 FROM done) FOR UPDATE), "
    "released AS (UPDATE {turn} t SET parked = n.parked - 1 "
    "FROM turn_now n WHERE t.id = n.id AND n.parked > 0 RETURNING 1) "
    "SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM released){wake}"
)


def create(
    code: str, *, owner: str, timeout_s: float | None, memory_mb: int | None, execution_id: uuid.UUID | None = None
) -> Execution:
    """A queued execution for ``owner``, with ``execution_id`` when given (a caller that
    listens for its result before the row exists). Raises ValueError for bad input and
    an OwnerError subclass (controlplane/owners/errors.py) when the owner is unknown,
    disabled, over a cap, or the deployment is full."""
    timeout_s = settings.EXECUTION_DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    memory_mb = settings.EXECUTION_DEFAULT_MEMORY_MB if memory_mb is None else int(memory_mb)
    if not isinstance(code, str) or not code.strip():
        raise ValueError("code must be a non-empty string")
    if len(code.encode()) > settings.EXECUTION_MAX_CODE_BYTES:
        raise ValueError(f"code is larger than {settings.EXECUTION_MAX_CODE_BYTES} bytes")
    if not 0 < timeout_s <= settings.EXECUTION_MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be in (0, {settings.EXECUTION_MAX_TIMEOUT_S:g}]")
    if not 32 <= memory_mb <= 16384:
        raise ValueError("memory_mb must be between 32 and 16384")
    with transaction.atomic():
        # The owner's row stays locked until this transaction commits (admission.py).
        admitted = admission.admit_execution(owner)
        row = Execution(
            id=execution_id or uuid.uuid4(),
            owner=admitted.name,
            code=code,
            timeout_ms=int(timeout_s * 1000),
            memory_mb=memory_mb,
        )
        if connection.vendor == "postgresql":
            _insert(row)
        else:
            row.save(force_insert=True)
        return row


# create()'s INSERT on PostgreSQL (_insert), built once: every column of the model.
INSERT_SQL = "INSERT INTO {table} ({columns}) VALUES ({values})"


def _insert(row: Execution) -> None:
    """The INSERT ``Execution.objects.create`` makes, written once (``_insert_sql``)
    instead of compiled by the ORM on every submit (admission.py says what that bought).
    Each value is what that INSERT would send: the field's ``pre_save`` (the creation
    time) and its conversion for the database. Nothing in Holdfast listens for the save
    signals this skips."""
    fields = Execution._meta.concrete_fields
    params = [field.get_db_prep_save(field.pre_save(row, True), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(), params)
    row._state.adding = False
    row._state.db = connection.alias


@functools.cache
def _insert_sql() -> str:
    fields = Execution._meta.concrete_fields
    if Execution._meta.parents or any(field.generated or field.has_db_default() for field in fields):
        # The ORM leaves such columns out of its INSERT or reads them back: do as it does.
        raise RuntimeError("Execution has a column the database fills: create() must insert through the ORM")
    return INSERT_SQL.format(
        table=connection.ops.quote_name(Execution._meta.db_table),
        columns=", ".join(connection.ops.quote_name(field.column) for field in fields),
        values=", ".join(["%s"] * len(fields)),
    )


def finish(execution_id: str, outcome: Outcome) -> bool:
    """running -> terminal, once. Returns whether this call recorded the outcome.

    Also replaces the sweep's ``interrupted`` (WORKER_LOST): that verdict is a guess made
    while no result was stored, and a result delivered late (held in the broker through a
    database outage) is what really happened. Every other terminal status wins.

    A recorded outcome frees a slot, so it also takes back one parked nudge, if any, and
    sends it again (dispatch.py), and wakes whoever waits for the result (notify.py). On
    PostgreSQL the three are one statement, one round trip on every execution's path."""
    values = {
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "error": outcome.error,
        "duration_ms": outcome.duration_ms,
        "host_id": outcome.host_id,
        "finished_at": timezone.now(),
    }
    # A late result replacing the sweep's verdict takes back one more parked nudge than
    # the sweep did for that row: a spare, which parks again if nothing can run.
    if connection.vendor != "postgresql":
        rows = Execution.objects.filter(
            Q(status=Status.RUNNING) | Q(status=Status.INTERRUPTED, error=WORKER_LOST), pk=execution_id
        )
        recorded = bool(rows.update(**values, attempts=F("attempts") + outcome.attempts))
        if recorded:
            notify.publish(execution_id)
            resend_parked(execution_id)
        return recorded
    recorded, released = _finish_in_one_statement(values, outcome.attempts, execution_id)
    if released:
        # The nudge names the ended row, as resend_parked's do.
        enqueue.enqueue_execution_on_commit(execution_id)
    return recorded


# The values finish() writes, in the order _finish_sql() sets them; then ``attempts``,
# added to the stored count.
FINISH_FIELDS = ("status", "exit_code", "stdout", "stderr", "error", "duration_ms", "host_id", "finished_at")


def _finish_in_one_statement(values: dict, attempts: int, execution_id: str) -> tuple[bool, bool]:
    """finish()'s UPDATE, the parked nudge taken back and the notification, in one
    statement. Returns (recorded, a parked nudge was taken back).

    The UPDATE is the one ``rows.update(**values)`` makes, written once
    (``_finish_sql``) instead of compiled by the ORM on every call, which took 0.8-1.7
    ms of the worker's time on each execution's path (docs/benchmarks.md, sixth
    session). Each value still goes through its field's own conversion for the
    database (``get_db_prep_save``: the output fields' NUL encoding, the time zone)."""
    meta = Execution._meta
    params = [meta.get_field(name).get_db_prep_save(values[name], connection) for name in FINISH_FIELDS]
    params += [
        attempts,
        meta.pk.get_db_prep_value(execution_id, connection),
        *(Status.RUNNING, Status.INTERRUPTED, WORKER_LOST),
    ]
    announce = notify.available()  # read once: the statement and its parameters agree
    returning_params, wake_params = [], []
    if announce:
        # The stored result rides along when it is small (notify.py, "The result in the
        # notification"): built by this statement from the row it wrote, and only when
        # its text is small enough to be worth building. First on the channel that
        # carries it, then the id alone on the one every release listens on.
        returning_params = [notify.ANNOUNCED_MAX_BYTES]
        wake_params = [
            *(notify.RESULT_CHANNEL, str(execution_id), notify.ANNOUNCED_MAX_BYTES),
            *(notify.CHANNEL, str(execution_id)),
        ]
    # As QuerySet.update does: an error inside an outer atomic block marks it for
    # rollback, so nothing goes on using a transaction the database has aborted.
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        cursor.execute(_finish_sql(announce), [*params, *returning_params, *wake_params])
        recorded, released = cursor.fetchone()[:2]
    return bool(recorded), bool(released)


@functools.cache
def _finish_sql(announce: bool) -> str:
    """The statement ``_finish_in_one_statement`` runs: the same text for every finish,
    so built once per process (and per ``announce``: whether it notifies)."""
    table = connection.ops.quote_name(Execution._meta.db_table)
    sets = ", ".join(f"{_column(name)} = %s" for name in FINISH_FIELDS)
    attempts, status = _column("attempts"), _column("status")
    update = FINISH_UPDATE_SQL.format(
        table=table, sets=sets, attempts=attempts, id=_column("id"), status=status, error=_column("error")
    )
    returning, wake = "1", ""
    if announce:
        returning = _announced_sql()
        wake = (
            ", (SELECT pg_notify(%s, %s || ' ' || announced) FROM done WHERE octet_length(announced) <= %s)"
            ", (SELECT pg_notify(%s, %s) FROM done)"
        )
    turn = connection.ops.quote_name(DispatchTurn._meta.db_table)
    return FINISH_SQL.format(update=update, turn=turn, returning=returning, wake=wake)


@functools.cache
def _announced_sql() -> str:
    """The RETURNING that builds the carried result (its size limit a parameter): the
    same text for every finish, so built once."""
    text = " + ".join(f"octet_length({_column(name)})" for name in ("stdout", "stderr", "error", "host_id"))
    pairs = ", ".join(f"'{name}', {_column(name)}" for name in notify.ANNOUNCED)
    return f"CASE WHEN {text} <= %s THEN json_build_object({pairs})::text END AS announced"


def _column(field: str) -> str:
    """The quoted column of an Execution field, for the statements built once here."""
    return connection.ops.quote_name(Execution._meta.get_field(field).column)


def request_cancel(execution_id: str) -> str:
    """Cancel a queued execution outright, or ask its worker to stop a running one.
    Returns the status after the request."""
    now = timezone.now()
    if Execution.objects.filter(pk=execution_id, status=Status.QUEUED).update(
        status=Status.CANCELLED, error=CANCELLED, cancel_requested_at=now, finished_at=now
    ):
        notify.publish(execution_id)
        return Status.CANCELLED
    Execution.objects.filter(pk=execution_id, status=Status.RUNNING, cancel_requested_at__isnull=True).update(
        cancel_requested_at=now
    )
    return Execution.objects.values_list("status", flat=True).get(pk=execution_id)


def abandon_unclaimed(execution_id: str, error: str) -> bool:
    """queued -> cancelled with ``error``, for a caller that stops waiting on a row no
    worker claimed. Loses to the claim: once a worker took it, this changes nothing."""
    now = timezone.now()
    abandoned = Execution.objects.filter(pk=execution_id, status=Status.QUEUED).update(
        status=Status.CANCELLED, error=error, cancel_requested_at=now, finished_at=now
    )
    if abandoned:
        notify.publish(execution_id)
    return bool(abandoned)


def cancel_requested(execution_id: str) -> bool:
    return Execution.objects.filter(pk=execution_id, cancel_requested_at__isnull=False).exists()


def sweep(now=None) -> dict[str, int]:
    """Repair what a crash left behind; both repairs are safe to repeat.

    * queued too long: its message may be lost (crash between commit and publish), so
      publish a dispatch nudge again; the claim's compare-and-set makes a duplicate
      harmless (a spare nudge dispatches one row that was queued anyway, or nothing);
    * queued past EXECUTION_MAX_QUEUE_WAIT_S: never run, failed as queue_wait_exceeded;
    * running far past its timeout: its worker died (SIGKILL, power). It may have run on
      a host, so it is never re-sent: it is marked interrupted.
    """
    now = now or timezone.now()
    dispatch.expire_overdue(now)
    requeue_before = now - timedelta(seconds=settings.EXECUTION_REQUEUE_AFTER_S)
    requeued = 0
    for pk in Execution.objects.filter(status=Status.QUEUED, created_at__lt=requeue_before).values_list(
        "pk", flat=True
    )[:500]:
        enqueue.publish(enqueue.RUN_EXECUTION, str(pk))
        requeued += 1
    interrupted: list[str] = []
    grace = timedelta(seconds=settings.EXECUTION_STALE_GRACE_S + settings.SANDBOX_RESULT_GRACE_S)
    for row in Execution.objects.filter(status=Status.RUNNING).only("pk", "started_at", "timeout_ms")[:500]:
        if row.started_at and row.started_at + timedelta(milliseconds=row.timeout_ms) + grace < now:
            swept = Execution.objects.filter(pk=row.pk, status=Status.RUNNING, started_at=row.started_at).update(
                status=Status.INTERRUPTED,
                error=WORKER_LOST,
                finished_at=now,
            )
            if swept:
                notify.publish(str(row.pk))
                interrupted.append(str(row.pk))
    if interrupted:
        # Slots freed: nudges parked because their owners were at the cap go out again.
        resend_parked(interrupted[0], count=len(interrupted))
    if requeued or interrupted:
        log.info("executions_swept", extra=fields(requeued=requeued, interrupted=len(interrupted)))
    return {"requeued": requeued, "interrupted": len(interrupted)}


def resend_parked(ended_id: str, count: int = 1) -> int:
    """``ended_id`` ended, so its owner may be back under its active cap: send again up
    to ``count`` nudges that found only owners at their cap (dispatch.py). Best effort:
    a nudge not sent now is sent by the sweep, which nudges for every stale queued row.

    The nudge names the ended row: a worker of the previous release, which claims the
    row its message names, finds it taken and stops (it cannot parse an empty id)."""
    sent = 0
    try:
        while sent < count and dispatch.release_parked():
            enqueue.publish(enqueue.RUN_EXECUTION, ended_id)
            sent += 1
    except DatabaseError:
        with contextlib.suppress(DatabaseError):
            connection.close()  # a fresh connection for the next attempt
    return sent
