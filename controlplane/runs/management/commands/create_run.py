"""manage.py create_run [--owner X] (--shell CMD | --python-file F) [--input k=v] [--secret NAME=VALUE]
[--timeout S] [--callback-url URL]"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from controlplane.commands import HoldfastCommand
from controlplane.owners.actions import ensure
from controlplane.owners.errors import OwnerError
from controlplane.runs import actions
from controlplane.runs.dispatch import enqueue_launch_on_commit
from controlplane.runs.errors import RunsError

DEFAULT_OWNER = "operator"


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"{what} must be NAME=VALUE")
        out[name] = value
    return out


class Command(HoldfastCommand):
    help = "Create a run and launch it; prints the run id."

    def add_arguments(self, parser: CommandParser) -> None:
        # Whose receipt chain the run joins; an operator's runs share one by default
        # ("operator", created if missing). A named owner must exist and be active.
        parser.add_argument("--owner", default=None)
        code = parser.add_mutually_exclusive_group(required=True)
        code.add_argument("--shell", help="a shell command")
        code.add_argument("--python-file", type=Path, help="a Python file to run")
        parser.add_argument("--input", action="append", default=[], metavar="NAME=VALUE")
        # Secrets reach the job's environment only; they are never printed back.
        parser.add_argument("--secret", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("--timeout", type=int, help="wall-clock limit in seconds")
        # Receives a signed POST on every terminal transition (docs/operations.md).
        parser.add_argument("--callback-url", default="", help="where to POST the run's progress notifications")

    def handle(self, *args: object, **options: object) -> None:
        if options["shell"] is not None:
            job: dict = {"kind": "shell", "command": options["shell"]}
        else:
            path = options["python_file"]
            try:
                job = {"kind": "python", "source": Path(path).read_text()}
            except OSError as exc:
                raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        job["inputs"] = _pairs(options["input"], "--input")
        if options["timeout"] is not None:
            job["timeout_s"] = options["timeout"]
        owner = options["owner"]
        if owner is None:
            owner = ensure(DEFAULT_OWNER).name
        try:
            with transaction.atomic():
                run = actions.create_run(
                    owner, job, _pairs(options["secret"], "--secret"), callback_url=options["callback_url"]
                )
                enqueue_launch_on_commit(run.id)
        except RunsError as exc:
            raise CommandError(exc.message) from None
        except OwnerError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(run.id))
