"""Which control-plane endpoints may be replayed after an ambiguous failure.

Whether a request whose answer was lost may be sent again is a property of the handler on
the far end, not of the caller, so it is declared once here, per endpoint, with the server
behaviour that justifies it. ``runner.transport`` looks the entry up from the endpoint name;
no call site can pass or override a policy. An endpoint missing from the table gets the
conservative default: an ambiguous failure (reset, read timeout, body cut, 5xx) is not
replayed, because an unclassified handler may not absorb a duplicate.

Failures that prove nothing reached a handler (refused, name resolution lost, no route,
connect timeout) are retried for every endpoint, listed here or not: they cannot duplicate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from runner.backoff import DEFAULT_OUTAGE_BUDGET_S, DEFAULT_RESULT_OUTAGE_BUDGET_S


@dataclass(frozen=True)
class EndpointPolicy:
    """How the transport treats one endpoint: an immutable value (STYLE habit 2)."""

    replay_safe: bool
    budget_s: float
    why: str


CONSERVATIVE_DEFAULT = EndpointPolicy(
    replay_safe=False,
    budget_s=DEFAULT_OUTAGE_BUDGET_S,
    why="Unclassified: nobody has shown its handler absorbs a duplicate, so a lost answer is not replayed.",
)

ENDPOINT_POLICIES: Mapping[str, EndpointPolicy] = MappingProxyType(
    {
        "hello": EndpointPolicy(
            replay_safe=True,
            budget_s=DEFAULT_OUTAGE_BUDGET_S,
            why=(
                "An idempotent claim keyed by the runner's instance id: a replay by the same "
                "instance returns the same session token, another instance gets 409 "
                "instance_conflict. A restart between commit and answer no longer fails the run."
            ),
        ),
        "bundle": EndpointPolicy(
            replay_safe=True,
            budget_s=DEFAULT_OUTAGE_BUDGET_S,
            why="A read: fetching the job twice changes nothing on the server.",
        ),
        "events": EndpointPolicy(
            replay_safe=True,
            budget_s=DEFAULT_OUTAGE_BUDGET_S,
            why=(
                "Each batch carries a client batch key, deduplicated inside the transaction and "
                "lock that assign sequence numbers: a replayed batch appends nothing and returns "
                "the original answer, so the receipt's counts stay right."
            ),
        ),
        "result": EndpointPolicy(
            replay_safe=True,
            # The verdict is the run: it gets the longer budget.
            budget_s=DEFAULT_RESULT_OUTAGE_BUDGET_S,
            why=(
                "The first result makes the run terminal; a replay gets 409 run_terminal with the "
                "recorded status, which the runner counts as recorded."
            ),
        ),
        "steer": EndpointPolicy(
            replay_safe=True,
            budget_s=DEFAULT_OUTAGE_BUDGET_S,
            why=(
                "Fetching marks nothing: the server marks delivered only the ids a poll "
                "acknowledges, and marking an id already marked is a no-op, so a replayed poll "
                "(the same ack) changes nothing more, and a lost answer is served again; the "
                "runner's handled set keeps a re-served message from being applied twice."
            ),
        ),
    }
)


def policy_for(endpoint: str) -> EndpointPolicy:
    """The table's entry for ``endpoint`` (a bare name, query string ignored), else the
    conservative default."""
    name = endpoint.split("?", 1)[0].strip("/")
    return ENDPOINT_POLICIES.get(name, CONSERVATIVE_DEFAULT)
