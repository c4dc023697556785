"""The sandbox host registry.

Rows are entered by an operator (the admin, ``manage.py register_host``) or appear on
their own the first time a worker holds a connection to a host id it does not know.
Hosts never write here: ``sandbox_host`` must not import Django, so everything a row
says about a host was observed by a worker (its pool's connections) or set by an
operator. States::

    active --(drain_host / admin action: operator)--------> draining
    active --(a worker saw the host's ``draining`` frame)--> draining
    draining --(no worker holds a connection for HOSTS_GONE_AFTER_S)--> gone
    draining(host) | gone(host) --(a worker opened a fresh, non-draining connection)--> active
    draining | gone --(admin action "mark active")--> active
"""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    ACTIVE = "active"
    DRAINING = "draining"
    GONE = "gone"


class DrainSource(models.TextChoices):
    NONE = "", "-"
    # An operator asked: the pools retire connections to it and stop dialing it until an
    # operator marks it active again.
    OPERATOR = "operator"
    # The host said so (SIGTERM): it clears itself when the host comes back.
    HOST = "host"


class SandboxHost(models.Model):
    name = models.CharField(max_length=64, unique=True, help_text="The host's --host-id, by convention.")
    address = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="Direct ws:// URL of this host (not the balancer's). Pools that dial hosts directly skip it "
        "while it is drained by an operator.",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE, db_index=True)
    drained_by = models.CharField(max_length=16, choices=DrainSource.choices, blank=True, default="")
    host_id = models.CharField(
        max_length=64, blank=True, default="", db_index=True, help_text="What the host reports in auth_ok."
    )
    isolation = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="The containment level the host reported in auth_ok (docs/operations.md, Containment).",
    )
    drain_started_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(
        null=True, blank=True, help_text="Last time a worker held a connection to this host."
    )
    notes = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "sandbox host"

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

    @property
    def reported_id(self) -> str:
        """The id connections report: the recorded one, else the name (the convention)."""
        return self.host_id or self.name
