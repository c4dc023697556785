"""Migration 0002 moves the loss stamp from the ``sandbox`` JSON into its indexed column:
a readable stamp is carried over, an unreadable one is dropped (it was never proof of a
loss), and the sandbox ref keeps its value."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("runs", "0001_initial")]
AFTER = [("runs", "0002_loss_observed_at")]


def test_the_json_stamp_moves_into_the_indexed_column():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    OldRun = executor.loader.project_state(BEFORE).apps.get_model("runs", "Run")
    stamped = OldRun.objects.create(
        owner="a", job={}, token_salt="s", sandbox={"ref": "sbx-1", "lossObservedAt": "2026-01-01T00:00:00Z"}
    )
    garbage = OldRun.objects.create(owner="a", job={}, token_salt="s", sandbox={"lossObservedAt": "not a time"})
    plain = OldRun.objects.create(owner="a", job={}, token_salt="s")
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        # The model as of that migration: later ones add columns this state has not.
        NewRun = executor.loader.project_state(AFTER).apps.get_model("runs", "Run")
        assert NewRun.objects.get(pk=stamped.pk).loss_observed_at == datetime(2026, 1, 1, tzinfo=UTC)
        assert NewRun.objects.get(pk=stamped.pk).sandbox_ref == "sbx-1"
        assert NewRun.objects.get(pk=garbage.pk).loss_observed_at is None
        assert NewRun.objects.get(pk=plain.pk).loss_observed_at is None
        indexes = connection.introspection.get_constraints(connection.cursor(), Run._meta.db_table)
        assert any(c["columns"] == ["loss_observed_at"] and c["index"] for c in indexes.values())
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
