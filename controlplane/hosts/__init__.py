"""Sandbox hosts as an operator sees them: the registry, the drain page, drain commands.

The worker side (``publisher``) writes each pool's snapshot to the cache and keeps the
registry's ``last_seen_at``/``host_id``/state fresh; the web side (``status``, ``views``)
reads the cache and the database only and never dials a host.
"""
