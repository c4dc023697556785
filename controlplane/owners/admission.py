"""Admission: whether an owner may add work now. Called inside the transaction that
creates the execution or run, so the owner's lock is held until the row is committed.

Rules (docs/operations.md, "Owners, fairness and caps"):

* An unknown or disabled owner is refused (``UnknownOwner``, ``OwnerDisabled``).
* An execution is refused with ``OwnerLimit`` (429) when its owner already has
  ``max_active`` executions running (the next one would be one too many at once) or
  ``max_queued`` waiting; a run when its owner has ``max_live_runs`` runs not yet ended.
* An execution is refused with ``AtCapacity`` (503) when the whole deployment has
  ``EXECUTION_MAX_QUEUED_TOTAL`` executions waiting, whoever asks.

Race safety: the owner's row is locked (``SELECT ... FOR UPDATE``) before anything is
counted, and its state (active flag, caps) is read from the row the lock returned,
i.e. after the wait, never from a look-up made before it. Two submits of one owner
therefore count one after the other, and an owner's caps are exact. The deployment's
total is counted under no global lock (that would serialize every submit of every
owner): concurrent submits of different owners may each pass it, so it can be exceeded
by at most the number of submits in flight at that moment, less one. On SQLite every
write transaction is serialized anyway, so there both are exact.
"""

from __future__ import annotations

import functools
import logging

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q

from controlplane.logthrottle import Throttled
from controlplane.owners.actions import caps
from controlplane.owners.errors import AtCapacity, OwnerDisabled, OwnerLimit, UnknownOwner
from controlplane.owners.models import Owner

log = logging.getLogger("holdfast.owners")
# A full deployment refuses every submit: one line per interval says so, with how many
# refusals it stands for, instead of a line per refusal growing with the flood.
AT_CAPACITY_LOG_EVERY_S = 10.0
at_capacity_log = Throttled(log, "at_capacity", AT_CAPACITY_LOG_EVERY_S)


def _locked_owner(name: str) -> Owner:
    """The owner called ``name``, locked for this transaction and read after the lock."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("admission must run inside the transaction that creates the work")
    if not (isinstance(name, str) and name):
        owner = None
    elif connection.vendor == "postgresql":
        owner = _locked_owner_in_postgres(name)
    else:
        owner = Owner.objects.select_for_update().filter(name=name).first()
    if owner is None:
        raise UnknownOwner(str(name))
    if not owner.is_active:
        raise OwnerDisabled(owner.name)
    return owner


def admit_execution(name: str) -> Owner:
    """Lock ``name`` and check it may queue one more execution; raises an OwnerError."""
    owner = _locked_owner(name)
    limits = caps(owner)
    active, queued, total = _counts(owner.name)
    if active >= limits.max_active:
        raise OwnerLimit(f"owner {owner.name!r} has {active} executions running; its cap is {limits.max_active}")
    if queued >= limits.max_queued:
        raise OwnerLimit(f"owner {owner.name!r} has {queued} executions queued; its cap is {limits.max_queued}")
    if total >= settings.EXECUTION_MAX_QUEUED_TOTAL:
        # Every owner's work together: the count is the operators', not the caller's to
        # read (the message goes to whichever owner asked), so it goes to the log.
        at_capacity_log.warning(queued=total, cap=settings.EXECUTION_MAX_QUEUED_TOTAL)
        raise AtCapacity()
    return owner


# On PostgreSQL the lock and the counts are statements written once (below) instead of
# queries the ORM compiles on every submit: with the INSERT written the same way
# (executions/actions.py), create() takes half the time it did (bench/create_cost.py;
# docs/benchmarks.md, ninth session), and the owner's lock is held that much less. Only
# quoted names are put in; every value is a parameter.


OWNER_SQL = "SELECT {columns} FROM {table} WHERE {name} = %s LIMIT 1 FOR UPDATE"
COUNTS_SQL = (
    "SELECT (SELECT count(*) FROM {table} WHERE {owner} = %s AND {status} = %s), "
    "(SELECT count(*) FROM {table} WHERE {owner} = %s AND {status} = %s), "
    "(SELECT count(*) FROM {table} WHERE {status} = %s)"
)


@functools.cache
def _owner_sql() -> tuple[str, tuple[str, ...]]:
    """What ``Owner.objects.select_for_update().filter(name=...).first()`` sends, less
    its ORDER BY (a name is unique), and the fields its columns fill, in order."""
    qn, meta = connection.ops.quote_name, Owner._meta
    if any(field.get_db_converters(connection) for field in meta.concrete_fields):
        # Owner.from_db is given the values as the driver returns them.
        raise RuntimeError("an Owner field converts what it reads: admission must lock through the ORM")
    columns = ", ".join(qn(field.column) for field in meta.concrete_fields)
    sql = OWNER_SQL.format(columns=columns, table=qn(meta.db_table), name=qn(meta.get_field("name").column))
    return sql, tuple(field.attname for field in meta.concrete_fields)


def _locked_owner_in_postgres(name: str) -> Owner | None:
    sql, fields = _owner_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [name])
        row = cursor.fetchone()
    return None if row is None else Owner.from_db(connection.alias, fields, row)


@functools.cache
def _counts_sql() -> str:
    """The owner's running and queued executions and the deployment's queued ones."""
    from controlplane.executions.models import Execution

    qn, meta = connection.ops.quote_name, Execution._meta
    return COUNTS_SQL.format(
        table=qn(meta.db_table), owner=qn(meta.get_field("owner").column), status=qn(meta.get_field("status").column)
    )


def _counts(name: str) -> tuple[int, int, int]:
    """The owner's running and queued executions and the deployment's queued ones,
    counted after the owner's lock: each statement has a snapshot of its own."""
    from controlplane.executions.models import Execution, Status

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_counts_sql(), [name, Status.RUNNING, name, Status.QUEUED, Status.QUEUED])
            return cursor.fetchone()
    mine = Execution.objects.filter(owner=name, status__in=(Status.RUNNING, Status.QUEUED)).aggregate(
        active=Count("pk", filter=Q(status=Status.RUNNING)), queued=Count("pk", filter=Q(status=Status.QUEUED))
    )
    return mine["active"], mine["queued"], Execution.objects.filter(status=Status.QUEUED).count()


def admit_run(name: str) -> Owner:
    """Lock ``name`` and check it may start one more run; raises an OwnerError."""
    from controlplane.runs.models import LIVE_STATUSES, Run

    owner = _locked_owner(name)
    limit = caps(owner).max_live_runs
    live = Run.objects.filter(owner=owner.name, status__in=LIVE_STATUSES).count()
    if live >= limit:
        raise OwnerLimit(f"owner {owner.name!r} has {live} runs not yet ended; its cap is {limit}")
    return owner
