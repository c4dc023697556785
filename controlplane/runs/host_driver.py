"""The real launch driver: asks a sandbox host over its WebSocket protocol.

Each call is a thin shell around one ``holdfast_wire.client.ClientSession`` (the same
client the executions pool uses), opened by ``wsclient.dial``. One short connection per
launch (launches are rare next to executions, so they do not share the executions
pool): connect, authenticate, send ``launch_run``, await ``run_launched``.
``HOLDFAST_SANDBOX_URL`` may list several addresses (comma-separated, parsed by
``holdfast_wire.addresses`` as for the pool) or one balancer. Reconcile probes hosts through this same driver
(``probe``: one ``probe_runs`` round trip per host per tick), and cancels and
reconcile stop sandboxes through it (``stop``).

What each answer proves, and so what the task may do next (DESIGN.md, Runs):

* nothing sent yet (connect or authentication failed, or ``auth_ok`` said draining):
  the next address is tried at once; none left -> ``LaunchUnavailable`` (retry later);
* ``not_started`` (draining, at capacity, spawn failed) or ``unknown_type`` (a host of
  a release without runs): the host started nothing, so the next address is tried;
* ``run_launched``: done (``already`` when an earlier launch of this run id did it);
* the connection drops or times out after ``launch_run`` was sent: the host may have
  started it. ``LaunchUnavailable`` at once, no other address: the task retries later,
  and a retry that reaches the same host is answered ``already``. One that a balancer
  sends to another host starts a second runner, whose ``hello`` is refused with
  ``409 instance_conflict``, so it exits without running the job (docs/runner-api.md);
* any other ``error`` for this launch: ``LaunchRefused``, the run fails.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import websocket

from controlplane.pool import wsclient
from holdfast_wire import addresses, client, protocol
from holdfast_wire.logfmt import fields

from .launcher import LaunchAck, LaunchRefused, LaunchRequest, LaunchUnavailable, SandboxProbe

log = logging.getLogger("holdfast.runs")

# Dials per configured address when looking for the host that runs a run: a balancer
# spreads connections over its targets, so a handful find one host among a few.
STOP_DIALS = 8
# Hosts probed at once by one tick: each waits on its own host, so a tick lasts as long
# as the slowest host rather than the sum of them all.
PROBE_THREADS = 16


class _TryElsewhere(Exception):
    """This host started nothing for the run: another address may be asked now."""


class _Late(Exception):
    """The host did not answer before the deadline."""


class _Call:
    """One short, authenticated connection: a client session over one socket."""

    def __init__(self, ws: websocket.WebSocket, session: client.ClientSession) -> None:
        self.ws = ws
        self.session = session

    def send(self, frame: protocol.Frame) -> None:
        self.ws.send(self.session.send(frame))

    def receive(self, deadline: float) -> list[client.Event]:
        """The events of the next message; ``_Late`` past ``deadline``. Socket errors
        (``OSError``, ``WebSocketException``) are the caller's to judge."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Late()
        self.ws.settimeout(remaining)
        try:
            message = self.ws.recv()
        except websocket.WebSocketTimeoutException:
            raise _Late() from None
        except UnicodeDecodeError:
            # The library's UTF-8 check is skipped (see ``_connect``), so ``recv`` decodes
            # strictly: a bad byte is an unreadable frame, ignored like any other.
            return [client.Ignored("malformed_json")]
        return self.session.receive(message)

    def close(self) -> None:
        self.ws.close()


@dataclass(frozen=True)
class WebSocketLaunchDriver:
    urls: tuple[str, ...]
    token: str
    # Timeouts
    connect_timeout_s: float
    reply_timeout_s: float
    probe_timeout_s: float = 10.0
    required_isolation: str = protocol.FULL_ISOLATION

    @classmethod
    def from_settings(cls) -> WebSocketLaunchDriver:
        from django.conf import settings

        return cls(
            urls=addresses.parse(settings.SANDBOX_URL),
            token=settings.SANDBOX_TOKEN,
            connect_timeout_s=settings.SANDBOX_CONNECT_TIMEOUT_S,
            reply_timeout_s=settings.RUNS_LAUNCH_REPLY_TIMEOUT_S,
            probe_timeout_s=settings.RECONCILE_PROBE_TIMEOUT_S,
            required_isolation=settings.SANDBOX_REQUIRED_ISOLATION,
        )

    def launch(self, request: LaunchRequest) -> LaunchAck:
        # A random first address spreads launches over a direct-dial list.
        start = random.randrange(len(self.urls)) if self.urls else 0
        reasons = []
        for url in self.urls[start:] + self.urls[:start]:
            try:
                return self._launch_on(url, request)
            except _TryElsewhere as exc:
                reasons.append(str(exc))
                log.info(
                    "run_launch_elsewhere", extra=fields(run_id=request.run_id, url=addresses.public(url), reason=exc)
                )
        raise LaunchUnavailable("no host took the run: " + "; ".join(reasons or ["no address configured"]))

    def stop(self, run_id: str, host_id: str) -> bool:
        """Ask the host that launched ``run_id`` to kill its sandbox; True once it answered.

        Only that host knows the run, so an address whose host is another one is closed
        unused. Behind a balancer the driver cannot choose, so it dials a few times
        (STOP_DIALS); the runner also stops its job on its own at its next call, which a
        cancelled run answers ``409 run_terminal``."""
        for attempt in range(STOP_DIALS * max(1, len(self.urls))):
            url = self.urls[attempt % len(self.urls)]
            try:
                call = self._connect(url)
            except _TryElsewhere:
                continue
            try:
                if call.session.host_id != host_id:
                    continue
                call.send(protocol.StopRun(id=run_id))
                deadline = time.monotonic() + self.reply_timeout_s
                while True:
                    for event in call.receive(deadline):
                        if isinstance(event, client.Answered) and isinstance(event.frame, protocol.RunStopped):
                            was_running = event.frame.was_running
                            log.info(
                                "run_stopped", extra=fields(run_id=run_id, host_id=host_id, was_running=was_running)
                            )
                            return True
                        if isinstance(event, (client.Answered, client.HostError)):
                            return False  # an error naming the stop, or none
            except (_Late, OSError, websocket.WebSocketException):
                return False
            finally:
                call.close()
        return False

    def probe(self, run_ids_by_host: dict[str, list[str]]) -> dict[str, dict[str, SandboxProbe]]:
        """One ``probe_runs`` round trip per host for all its runs (DESIGN.md, Reconcile:
        a tick costs one round trip per host, not per run).

        Each address is dialled (all at once, one thread each, so a tick lasts as long
        as its slowest host, not the sum) and the host it reaches (``auth_ok.host_id``)
        is asked for its runs on that one connection, in frames of at most
        ``MAX_PROBE_IDS`` ids. A host that does not answer in full is left out: not
        knowing is not a loss, and it is not asked twice in one tick. Several addresses
        are hosts, each dialled once per tick; a single address is a balancer, dialled
        again while hosts are missing, up to STOP_DIALS times."""
        wanted = {host: list(ids) for host, ids in run_ids_by_host.items() if ids}
        answers: dict[str, dict[str, SandboxProbe]] = {}
        claimed: set[str] = set()
        lock = threading.Lock()

        def dial(url: str) -> bool:
            """Probe the host behind ``url`` if it is wanted; True if it was reached."""
            try:
                call = self._connect(url, any_isolation=True)
            except _TryElsewhere:
                return False  # unreachable this tick: its host stays silent
            try:
                host = call.session.host_id
                with lock:
                    mine = host in wanted and host not in claimed
                    claimed.add(host)
                if mine:
                    statuses = self._probe_on(call, wanted[host])
                    if statuses is not None:
                        with lock:
                            answers[host] = statuses
                return True
            finally:
                call.close()

        urls = list(self.urls)
        for _ in range(STOP_DIALS):
            if not urls or len(answers) == len(wanted):
                break
            with ThreadPoolExecutor(max_workers=min(len(urls), PROBE_THREADS)) as pool:
                reached = list(pool.map(dial, urls))
            # One address is a balancer: the next dial may reach another of its hosts.
            # Each of several addresses is a host, asked once per tick.
            urls = urls if len(self.urls) == 1 and all(reached) else []
        silent = sorted(set(wanted) - set(answers))
        if silent:
            log.info("run_probe_silent", extra=fields(hosts=",".join(silent)))
        return answers

    def _probe_on(self, call: _Call, run_ids: list[str]) -> dict[str, SandboxProbe] | None:
        chunks = [run_ids[i : i + protocol.MAX_PROBE_IDS] for i in range(0, len(run_ids), protocol.MAX_PROBE_IDS)]
        pending = {f"probe-{i}": chunk for i, chunk in enumerate(chunks)}
        statuses: dict[str, SandboxProbe] = {}
        try:
            for ref, chunk in pending.items():
                call.send(protocol.ProbeRuns(ids=chunk, ref=ref))
            deadline = time.monotonic() + self.probe_timeout_s
            while pending:
                for event in call.receive(deadline):
                    if isinstance(event, client.HostError):
                        return None  # e.g. unknown_type: a host of a release without runs
                    if not (isinstance(event, client.Answered) and isinstance(event.frame, protocol.RunStatus)):
                        continue
                    for run_id in pending.pop(event.id, []):
                        item = event.frame.statuses.get(run_id)
                        if not isinstance(item, dict) or item.get("status") not in protocol.RUN_STATUSES:
                            # Not named, or a status of a newer host we cannot read: it
                            # proves nothing, so this run is left out (untouched).
                            continue
                        code = item.get("exit_code")
                        statuses[run_id] = SandboxProbe(item["status"], code if isinstance(code, int) else None)
        except (_Late, OSError, websocket.WebSocketException):
            return None
        return statuses

    def _launch_on(self, url: str, request: LaunchRequest) -> LaunchAck:
        call = self._connect(url)
        try:
            if call.session.draining:
                raise _TryElsewhere("draining")
            frame = protocol.LaunchRun(
                id=request.run_id, key=request.launch_key, control_plane_url=request.control_plane_url
            )
            try:
                call.send(frame)
            except (OSError, websocket.WebSocketException) as exc:
                # A send that failed may still have put the frame on the wire.
                raise LaunchUnavailable(f"connection lost sending the launch: {type(exc).__name__}") from None
            return self._await_answer(call)
        finally:
            call.close()

    def _connect(self, url: str, *, any_isolation: bool = False) -> _Call:
        """Connected and authenticated, or ``_TryElsewhere``: nothing about the run was sent.
        ``any_isolation``: a probe sends nothing secret and must see every host that may
        hold runs, whatever its level (a run is never launched below the level anyway)."""
        session = client.ClientSession(
            token=self.token,
            client=f"launcher pid={os.getpid()}",
            # A run's sandbox holds its key and job: never on a host below the required level.
            required_isolation=None if any_isolation else self.required_isolation,
        )
        try:
            # The library's UTF-8 check is pure Python (most of a 10,000-run probe's
            # time); a text frame is still decoded strictly by ``recv``, so a bad byte
            # raises UnicodeDecodeError there, which ``_Call`` treats as an unreadable frame.
            ws, _ = wsclient.dial(url, session, timeout_s=self.connect_timeout_s, skip_utf8_validation=True)
        except wsclient.DialFailed as exc:
            raise _TryElsewhere(str(exc)) from None
        return _Call(ws, session)

    def _await_answer(self, call: _Call) -> LaunchAck:
        deadline = time.monotonic() + self.reply_timeout_s
        while True:
            try:
                events = call.receive(deadline)
            except _Late:
                raise LaunchUnavailable("the host did not answer the launch in time") from None
            except (OSError, websocket.WebSocketException) as exc:
                raise LaunchUnavailable(f"connection lost awaiting the launch: {type(exc).__name__}") from None
            for event in events:
                if isinstance(event, client.Movable):
                    raise _TryElsewhere(f"not_started({event.frame.reason})")
                frame = event.frame if isinstance(event, (client.Answered, client.HostError)) else None
                if isinstance(frame, protocol.RunLaunched):
                    return LaunchAck(host_id=call.session.host_id, already_launched=frame.already)
                if isinstance(frame, protocol.Error):
                    if frame.code == "unknown_type":
                        # A host of a release without runs: it started nothing.
                        raise _TryElsewhere("host does not launch runs")
                    raise LaunchRefused(f"host refused the launch: {frame.code}")
                # ``draining`` after our frame: the host still answers the launch itself.
