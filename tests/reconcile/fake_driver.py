"""A FAKE probe driver, named as such, used ONLY to force exact interleavings that real
hosts cannot be made to produce on demand (a row changed while a probe is in flight).
Everything else in these tests uses the real WebSocket driver against real hosts.

``answers`` is what each host "says"; ``during`` runs inside the probe call, after the
tick took its snapshot and before the answer returns: exactly where another tick, a
runner or a host restart can move the row under it."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.runs.launcher import SandboxProbe


class FakeProbeDriverForInterleavings:
    def __init__(
        self,
        answers: dict[str, dict[str, str]],
        *,
        during: Callable[[], None] | None = None,
        silent: tuple[str, ...] = (),
    ) -> None:
        self.answers = answers
        self.during = during
        self.silent = set(silent)
        self.calls: list[dict[str, list[str]]] = []

    def probe(self, run_ids_by_host: dict[str, list[str]]) -> dict[str, dict[str, SandboxProbe]]:
        self.calls.append({host: list(ids) for host, ids in run_ids_by_host.items()})
        if self.during is not None:
            during, self.during = self.during, None  # once: a nested tick probes too
            during()
        out: dict[str, dict[str, SandboxProbe]] = {}
        for host, ids in run_ids_by_host.items():
            if host in self.silent:
                continue
            said = self.answers.get(host, {})
            out[host] = {run_id: SandboxProbe(said.get(run_id, "unknown")) for run_id in ids}
        return out
