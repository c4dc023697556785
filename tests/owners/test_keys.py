"""Owners and API keys: a key is shown once, stored as a digest, and stops working when
revoked or when its owner is disabled; unknown and disabled owners are refused."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.owners import actions, keys
from controlplane.owners.errors import OwnerDisabled, UnknownOwner
from controlplane.owners.models import ApiKey, Owner

pytestmark = pytest.mark.django_db


def test_a_key_authenticates_its_owner_and_only_its_digest_is_stored():
    owner = Owner.objects.create(name="acme")
    row, raw = keys.create_key(owner, label="ci")
    assert raw.startswith(f"hf_{row.prefix}_")
    assert raw not in {row.digest, row.prefix} and raw.split("_", 2)[2] not in row.digest
    found = keys.authenticate(raw)
    assert found is not None and found.owner == owner
    assert ApiKey.objects.get(pk=row.pk).last_used_at is not None


@pytest.mark.parametrize("mangle", [lambda raw: raw[:-1] + ("A" if raw[-1] != "A" else "B"), lambda raw: "", "hf__x"])
def test_a_wrong_or_malformed_key_is_refused(mangle):
    owner = Owner.objects.create(name="acme")
    _, raw = keys.create_key(owner)
    assert keys.authenticate(mangle(raw) if callable(mangle) else mangle) is None


def test_a_revoked_key_and_a_disabled_owner_s_key_are_refused():
    owner = Owner.objects.create(name="acme")
    row, raw = keys.create_key(owner)
    _, other_raw = keys.create_key(owner)
    assert keys.revoke(row) is True
    assert keys.revoke(row) is False
    assert keys.authenticate(raw) is None
    assert keys.authenticate(other_raw) is not None
    Owner.objects.filter(pk=owner.pk).update(is_active=False)
    assert keys.authenticate(other_raw) is None


def test_resolve_refuses_unknown_and_disabled_owners():
    Owner.objects.create(name="off", is_active=False)
    with pytest.raises(UnknownOwner, match="create_owner nobody"):
        actions.resolve("nobody")
    with pytest.raises(OwnerDisabled):
        actions.resolve("off")


def test_caps_fall_back_to_the_deployment_defaults(settings):
    settings.OWNER_MAX_ACTIVE, settings.OWNER_MAX_QUEUED = 7, 70
    owner = Owner.objects.create(name="acme", max_queued=3)
    assert actions.caps(owner).max_active == 7
    assert actions.caps(owner).max_queued == 3


def test_the_commands_create_an_owner_and_print_a_key_once():
    out = io.StringIO()
    call_command("create_owner", "acme", "--weight", "3", stdout=out)
    assert "created owner acme (weight 3)" in out.getvalue()
    out = io.StringIO()
    call_command("create_api_key", "acme", stdout=out)
    raw = out.getvalue().strip()
    assert keys.authenticate(raw).owner.name == "acme"
    with pytest.raises(CommandError, match="weight"):
        call_command("create_owner", "acme", "--weight", "9", stdout=io.StringIO())
    with pytest.raises(CommandError, match="unknown owner"):
        call_command("create_api_key", "nobody", stdout=io.StringIO())
