"""What the pool says about its connections: typed states, reasons and snapshots, and
the listener hook through which other parts (the drain page's publisher) learn of
changes without reading logs.

A connection's life (``connection.py``)::

    OPEN --(max age reached, the host said it is draining, an operator drain)--> RETIRING
    RETIRING --(nothing left in flight)--> CLOSED
    OPEN | RETIRING --(socket dropped, pool closed)--> CLOSED
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass


class ConnState(enum.StrEnum):
    OPEN = "open"  # takes new work
    RETIRING = "retiring"  # takes no new work; closes once nothing is in flight
    CLOSED = "closed"


class RetireReason(enum.StrEnum):
    """Why a connection stopped taking new work. The values are shown on the drain page
    and published in worker snapshots, so they are part of the product."""

    MAX_AGE = "max age"
    HOST_DRAINING = "host draining"  # the host's draining frame, or auth_ok said so
    # A not_started(draining) answer: the same news as HOST_DRAINING, by another road.
    HOST_REFUSED_DRAINING = "host refused new work: draining"
    OPERATOR_DRAIN = "operator drain"


@dataclass(frozen=True)
class ConnectionSnapshot:
    """One connection at one moment, for the drain page and tests."""

    host_id: str
    url: str
    state: ConnState
    retire_reason: RetireReason | None = None
    age_s: float = 0.0
    max_age_s: float = 0.0
    in_flight: int = 0
    finished: int = 0
    # What the host said of its containment in auth_ok (protocol.ISOLATION_LEVELS), and
    # how many sandboxes it keeps prepared (None: a host that does not say).
    isolation: str = ""
    reserve: int | None = None

    def as_dict(self) -> dict:
        """JSON-safe (the enums are strings)."""
        body = asdict(self)
        body["state"] = str(self.state)
        body["retire_reason"] = str(self.retire_reason) if self.retire_reason else ""
        return body


class PoolListener:
    """Subclass and override what you need, then ``pool.add_listener(listener)``
    (dramatiq's middleware pattern). Hooks run in the thread that made the change, after
    it was made and outside the pool's locks; they must be quick and must not call back
    into the connection. A hook that raises is logged and ignored."""

    def connection_opened(self, conn: ConnectionSnapshot) -> None:
        """An authenticated connection joined the pool."""

    def connection_retiring(self, conn: ConnectionSnapshot) -> None:
        """``conn`` takes no new work from now on (``conn.retire_reason`` says why)."""

    def connection_closed(self, conn: ConnectionSnapshot) -> None:
        """``conn`` is closed; whatever was in flight on it is resolved."""


__all__ = ["ConnState", "ConnectionSnapshot", "PoolListener", "RetireReason"]
