"""Every Holdfast management command ends a missing prerequisite (a database not
migrated or unreachable, a broker that does not answer) with one clear line, never a
traceback: they all derive from ``HoldfastCommand``."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.core.management import find_commands

from controlplane.commands import HoldfastCommand

OURS = [
    (config.name, name)
    for config in apps.get_app_configs()
    if config.name.startswith("controlplane.")
    for name in find_commands(config.path + "/management")
]


def test_the_scan_finds_the_commands():
    names = {name for _, name in OURS}
    assert {"execute", "demo", "steer", "reconcile", "create_owner"} <= names


@pytest.mark.parametrize(("app", "name"), OURS)
def test_every_command_is_a_holdfast_command(app, name):
    command = importlib.import_module(f"{app}.management.commands.{name}").Command
    assert issubclass(command, HoldfastCommand), f"{app}: {name} does not derive from HoldfastCommand"
