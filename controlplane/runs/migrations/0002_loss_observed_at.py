"""Reconcile: the loss stamp becomes an indexed column (it was a key in Run.sandbox), plus
the relaunch mark, the callback URL and the outbound notifications."""

import django.db.models.deletion
from django.db import migrations, models


def copy_sandbox_json(apps, schema_editor):
    """Carry the JSON field's ref and loss stamp into their columns. A stamp that does
    not parse is dropped: an unreadable stamp was never proof of a loss (reconcile
    stamps the run afresh on its next lost observation)."""
    from datetime import UTC, datetime

    Run = apps.get_model("runs", "Run")
    for run in Run.objects.exclude(sandbox={}).only("id", "sandbox").iterator():
        data = run.sandbox if isinstance(run.sandbox, dict) else {}
        stamp = None
        raw = data.get("lossObservedAt")
        if isinstance(raw, str):
            try:
                stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                stamp = None
            if stamp is not None and stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=UTC)
        ref = data.get("ref") if isinstance(data.get("ref"), str) else ""
        Run.objects.filter(pk=run.pk).update(loss_observed_at=stamp, sandbox_ref=ref[:200])


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="callback_url",
            field=models.CharField(blank=True, default="", max_length=2000),
        ),
        migrations.AddField(
            model_name="run",
            name="loss_observed_at",
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="relaunched_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="sandbox_ref",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.CreateModel(
            name="RunNotification",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("provisioning", "Provisioning"),
                            ("running", "Running"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                            ("interrupted", "Interrupted"),
                        ],
                        max_length=16,
                    ),
                ),
                ("url", models.CharField(max_length=2000)),
                ("attempts", models.IntegerField(default=0)),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("abandoned_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.CharField(blank=True, default="", max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="notifications", to="runs.run"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "status"), name="runs_notification_once")],
            },
        ),
        migrations.RunPython(copy_sandbox_json, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name="run",
            name="sandbox",
        ),
    ]
