"""The sandbox host address list, parsed in one place.

``HOLDFAST_SANDBOX_URL`` is one address (a balancer, or one host) or a comma-separated
list of hosts dialled directly, in turn. The pool, the launch driver and the reconcile
prober all read it through ``parse``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

SCHEMES = frozenset({"ws", "wss"})


def parse(value: str) -> tuple[str, ...]:
    """The addresses in ``value``, in order, blanks dropped."""
    return tuple(u.strip() for u in value.split(",") if u.strip())


def usable(url: str) -> bool:
    """A ``ws://`` or ``wss://`` address naming a host."""
    parts = urlsplit(url)
    return parts.scheme in SCHEMES and bool(parts.hostname)


def public(url: str) -> str:
    """scheme://host:port only: never credentials, a path or a query in an error text."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
