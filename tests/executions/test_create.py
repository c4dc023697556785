"""``actions.create``: the row it stores is the one ``Execution.objects.create`` would
store (on PostgreSQL its INSERT and admission's statements are written once, not
compiled by the ORM per submit), and what it returns is that row as read back."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from controlplane.executions import actions
from controlplane.executions.models import Execution
from controlplane.owners import admission
from controlplane.owners.errors import OwnerDisabled, UnknownOwner
from controlplane.owners.models import Owner

pytestmark = pytest.mark.django_db


def _values(row: Model) -> dict[str, object]:
    return {field.attname: getattr(row, field.attname) for field in type(row)._meta.concrete_fields}


def test_the_row_created_is_the_one_the_orm_would_store_and_is_returned_as_read_back():
    Owner.objects.create(name="maker")
    before = timezone.now()
    row = actions.create("print('é')\n", owner="maker", timeout_s=2.5, memory_mb=96, execution_id=uuid.uuid4())
    stored = Execution.objects.get(pk=row.pk)
    assert _values(row) == _values(stored)
    assert not row._state.adding and row._state.db == stored._state.db
    assert before <= stored.created_at <= timezone.now()
    twin = Execution.objects.create(owner="maker", code="print('é')\n", timeout_ms=2500, memory_mb=96)
    expected = _values(Execution.objects.get(pk=twin.pk))
    assert {**_values(stored), "id": None, "created_at": None} == {**expected, "id": None, "created_at": None}
    assert abs(stored.created_at - twin.created_at) < timedelta(seconds=5)


def test_admission_reads_the_owner_it_locked():
    owner = Owner.objects.create(name="capped", weight=3, max_active=5, max_queued=7, max_live_runs=2)
    with transaction.atomic():
        locked = admission.admit_execution("capped")
    assert _values(locked) == _values(Owner.objects.get(pk=owner.pk))
    Owner.objects.create(name="off", is_active=False)
    with pytest.raises(OwnerDisabled):
        actions.create("print(1)", owner="off", timeout_s=None, memory_mb=None)
    with pytest.raises(UnknownOwner):
        actions.create("print(1)", owner="nobody", timeout_s=None, memory_mb=None)
    assert not Execution.objects.exists()
