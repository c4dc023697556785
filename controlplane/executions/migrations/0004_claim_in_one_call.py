"""The fair-dispatch claim as one PostgreSQL function, so a worker's claim is one round
trip instead of eight under the turn lock (controlplane/executions/dispatch.py says
why, and keeps the same rule in Python for SQLite; tests hold both to one order).

Frozen here like any migration: a change to the rule is a new migration that replaces
the function."""

from django.db import migrations

CLAIM_FUNCTION = r"""
CREATE OR REPLACE FUNCTION holdfast_claim_next(
    p_worker text, p_default_max_active integer, p_cutoff timestamptz, p_now timestamptz
) RETURNS TABLE (outcome text, execution_id uuid, code text, timeout_ms integer, memory_mb integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    turn record;
    chosen_owner text;
    chosen_used integer;
    blocked bigint;
    found_row record;
BEGIN
    SELECT d.owner, d.used INTO turn FROM executions_dispatchturn d WHERE d.id = 1 FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO executions_dispatchturn (id, owner, used, parked, dispatched)
        VALUES (1, '', 0, 0, 0) ON CONFLICT (id) DO NOTHING;
        SELECT d.owner, d.used INTO turn FROM executions_dispatchturn d WHERE d.id = 1 FOR UPDATE;
    END IF;
    LOOP
        -- Each statement of a READ COMMITTED function reads what is committed now: a row
        -- cancelled or claimed since the last pass is seen, as by the Python loop.
        SELECT c.owner, CASE WHEN c.owner = turn.owner AND turn.used < c.weight THEN turn.used + 1 ELSE 1 END
        INTO chosen_owner, chosen_used
        FROM (
            SELECT e.owner, coalesce(o.weight, 1) AS weight
            FROM executions_execution e LEFT JOIN owners_owner o ON o.name = e.owner
            WHERE e.status IN ('queued', 'running')
            GROUP BY e.owner, o.weight, o.max_active
            HAVING count(*) FILTER (WHERE e.status = 'queued') > 0
               AND count(*) FILTER (WHERE e.status = 'running') < coalesce(o.max_active, p_default_max_active)
        ) c
        -- Names compare by code point (COLLATE "C"), as Python's sorted() does.
        ORDER BY (c.owner = turn.owner AND turn.used < c.weight) DESC,
                 (c.owner COLLATE "C" > turn.owner COLLATE "C") DESC,
                 c.owner COLLATE "C"
        LIMIT 1;
        IF NOT FOUND THEN
            SELECT count(*) INTO blocked FROM executions_execution e WHERE e.status = 'queued';
            IF blocked = 0 THEN
                RETURN QUERY SELECT 'empty'::text, NULL::uuid, NULL::text, NULL::integer, NULL::integer;
                RETURN;
            END IF;
            UPDATE executions_dispatchturn SET parked = least(parked + 1, blocked) WHERE id = 1;
            RETURN QUERY SELECT 'parked'::text, NULL::uuid, NULL::text, NULL::integer, NULL::integer;
            RETURN;
        END IF;
        SELECT e.id, e.created_at, e.code, e.timeout_ms, e.memory_mb INTO found_row
        FROM executions_execution e
        WHERE e.owner = chosen_owner AND e.status = 'queued'
        ORDER BY e.created_at, e.id
        LIMIT 1;
        CONTINUE WHEN NOT FOUND;
        IF found_row.created_at < p_cutoff THEN
            RETURN QUERY SELECT 'overdue'::text, found_row.id, NULL::text, NULL::integer, NULL::integer;
            RETURN;
        END IF;
        UPDATE executions_execution SET status = 'running', started_at = p_now, worker = left(p_worker, 200)
        WHERE id = found_row.id AND status = 'queued';
        IF FOUND THEN
            UPDATE executions_dispatchturn
            SET owner = chosen_owner, used = chosen_used, dispatched = dispatched + 1
            WHERE id = 1;
            RETURN QUERY SELECT 'claimed'::text, found_row.id, found_row.code,
                                found_row.timeout_ms::integer, found_row.memory_mb::integer;
            RETURN;
        END IF;
    END LOOP;
END
$$;
"""

DROP_FUNCTION = "DROP FUNCTION IF EXISTS holdfast_claim_next(text, integer, timestamptz, timestamptz);"


def create_function(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM_FUNCTION)


def drop_function(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0003_fair_dispatch"),
        ("owners", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_function, drop_function)]
