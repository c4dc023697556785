"""The base of every Holdfast management command: a missing prerequisite (a database
not migrated or unreachable, a broker that does not answer) ends the command with one
clear line on stderr and exit status 1, never a traceback."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from kombu.exceptions import OperationalError as BrokerError


def first_line(exc: BaseException) -> str:
    """An exception as one short line: its message's first line, or its class."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


class HoldfastCommand(BaseCommand):
    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            raise CommandError(f"database error: {first_line(exc)} (has `python manage.py migrate` run?)") from None
        except BrokerError as exc:
            # The URL may hold a password: name the scheme and host only.
            broker = settings.CELERY_BROKER_URL.split("@")[-1]
            raise CommandError(f"cannot reach the Celery broker ({broker}): {first_line(exc)}") from None
