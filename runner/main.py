"""The runner's life: hello -> bundle -> run the job as a child -> stream its lines as events
-> result. Every control-plane call goes through ``ControlPlaneClient.call``.

``python -m runner`` (no arguments) is how a sandbox host starts it: the run id and the
control plane's URL come from HOLDFAST_RUN_ID and HOLDFAST_CONTROL_PLANE_URL; the run's
key from a descriptor named by HOLDFAST_RUN_KEY_FD (a pipe the host filled: the key is
in no environment, file or command line of the sandbox), or, run by hand, from
HOLDFAST_RUN_KEY. HOLDFAST_CONTROL_PLANE_SOCKET, when set, is the Unix socket the host
relays to the control plane (a run sandbox has no network). They are taken out of the
environment at once, and the job child never sees the key: its environment is built
from nothing but PATH, a temp HOME, the job's inputs and its injected secrets; and the
runner makes itself non-dumpable before it reads the key, so the job (same uid) cannot
read it from /proc/<runner pid>/ or ptrace it (the sandbox's seccomp filter refuses
ptrace and process_vm_readv as well).

Exit codes: 0 the job succeeded, 1 it did not (or the verdict could not be recorded),
2 usage (arguments given, or a variable missing). A hello, bundle or result that cannot
be delivered within its outage budget leaves exactly one ``runner: undeliverable ...``
line on stderr (run id, endpoint, attempted status, attempts, failure class: never a
secret) and exits 1 without a traceback; reconcile then finds the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from runner.events import EventStream, pump_lines
from runner.log import fields, log, use_redactor
from runner.redact import Redactor, diagnostic_fields
from runner.steer import Steering
from runner.transport import ControlPlaneClient, RunTerminal, TransportError

# Timeouts
# A job without its own timeout gets an hour: long runs are the point, endless ones are not.
DEFAULT_JOB_TIMEOUT_S = 3600.0
# How long the child's process group has between SIGTERM and SIGKILL.
DEFAULT_KILL_GRACE_S = 5.0

ENV_NAMES = ("HOLDFAST_CONTROL_PLANE_URL", "HOLDFAST_RUN_ID", "HOLDFAST_RUN_KEY")
KEY_FD_ENV = "HOLDFAST_RUN_KEY_FD"
SOCKET_ENV = "HOLDFAST_CONTROL_PLANE_SOCKET"
# A run key is a few dozen characters; more from the descriptor is not a key.
_MAX_KEY_BYTES = 4096
_PR_SET_DUMPABLE = 4


@dataclass
class JobOutcome:
    status: str  # succeeded | failed | cancelled
    exit_code: int | None
    error: str


def _child_env(job: dict[str, Any], home: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    env["HOLDFAST_INPUTS"] = json.dumps(job.get("inputs") or {})
    # Steering messages arrive as JSON lines on stdin (runner/steer.py).
    env["HOLDFAST_STEER"] = "stdin"
    for name, value in (job.get("secrets") or {}).items():
        env[str(name)] = str(value)
    return env


def run_job(
    job: dict[str, Any],
    stream: EventStream,
    *,
    kill_grace_s: float = DEFAULT_KILL_GRACE_S,
    steering: Steering | None = None,
) -> JobOutcome:
    """Run the job in its own process group, pumping stdout and stderr lines into ``stream``;
    ``steering`` acts on the child (SIGINT, stdin lines) while it runs."""
    with tempfile.TemporaryDirectory(prefix="holdfast-job-") as home:
        if job.get("kind") == "python":
            path = os.path.join(home, "job.py")
            with open(path, "w") as fh:
                fh.write(str(job.get("source", "")))
            argv = [sys.executable, path]
        else:
            argv = ["/bin/sh", "-c", str(job.get("command", ""))]
        child = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(job, home),
            cwd=home,
            start_new_session=True,
        )
        timed_out = threading.Event()
        drain_failed = threading.Event()

        def kill(mark: threading.Event) -> None:
            mark.set()
            for sig, pause in ((signal.SIGTERM, kill_grace_s), (signal.SIGKILL, 0.0)):
                try:
                    os.killpg(child.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    child.wait(pause)
                    return
                except subprocess.TimeoutExpired:
                    continue

        timer = threading.Timer(float(job.get("timeout_s") or DEFAULT_JOB_TIMEOUT_S), kill, args=(timed_out,))
        timer.daemon = True

        def on_drain_failure(exc: TransportError) -> None:
            # The run's output can no longer be recorded, so its verdict is failed whatever the
            # child does: clear the armed timeout (it must not fire a second, racing kill) and
            # stop the child. The readers keep reading, so a child on a full pipe can exit.
            timer.cancel()
            threading.Thread(target=kill, args=(drain_failed,), daemon=True).start()

        stream.on_failure(on_drain_failure)
        timer.start()
        readers = [
            threading.Thread(target=pump_lines, args=(child.stdout, stream, "stdout"), daemon=True),
            threading.Thread(target=pump_lines, args=(child.stderr, stream, "stderr"), daemon=True),
        ]
        for reader in readers:
            reader.start()
        assert child.stdin is not None
        if steering is not None:
            steering.attach(child.pid, child.stdin.fileno())
        code = child.wait()
        timer.cancel()
        if steering is not None:
            steering.stop()
        with contextlib.suppress(OSError):
            child.stdin.close()
        for reader in readers:
            reader.join()
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()
        child.stderr.close()
    if drain_failed.is_set() or stream.failure is not None:
        return JobOutcome("failed", code, "events could not be delivered to the control plane")
    if timed_out.is_set():
        return JobOutcome("failed", code, "job timed out")
    return JobOutcome("succeeded" if code == 0 else "failed", code, "" if code == 0 else f"exit code {code}")


def report_result(client: ControlPlaneClient, outcome: JobOutcome, redactor: Redactor) -> None:
    """Post the verdict. A 409 run_terminal means a verdict is already recorded (ours, replayed
    after a lost answer, or another): it counts as recorded; a different one leaves one line."""
    body = {"status": outcome.status, "exit_code": outcome.exit_code, "error": redactor.text(outcome.error)}
    try:
        client.call("POST", "result", body={**body, "summary": {}})
    except RunTerminal as exc:
        if exc.recorded_status != outcome.status:
            data = {
                "run_id": client.run_id,
                "attempted_status": outcome.status,
                "recorded_status": exc.recorded_status,
                "exit_code": outcome.exit_code,
                "error": outcome.error,
            }
            log.warning("result_discarded_run_terminal", extra=fields(**diagnostic_fields(data, redactor)))


def _log_retry(endpoint: str, attempt: int, reason: str) -> None:
    # Endpoint, a count and a failure class or status: nothing secret can be in it.
    log.info("retry", extra=fields(endpoint=endpoint, attempt=attempt, reason=reason))


class Undeliverable(Exception):
    """A call the run cannot go on without (hello, bundle, the result) failed for good.
    Carries coordinates only: ``main`` turns it into one breadcrumb line and exit 1, and
    reconcile finds the run through its host (its sandbox exited without a result)."""

    def __init__(self, endpoint: str, attempts: int, reason: str, attempted_status: str | None = None) -> None:
        super().__init__(endpoint)
        self.endpoint = endpoint
        self.attempts = attempts
        self.reason = reason
        self.attempted_status = attempted_status

    @classmethod
    def from_transport(cls, exc: TransportError, attempted_status: str | None = None) -> Undeliverable:
        # The class name and counts only: a message may quote a server's words.
        return cls(
            getattr(exc, "endpoint", "?"),
            int(getattr(exc, "attempts", 1) or 1),
            type(exc).__name__,
            attempted_status,
        )


def breadcrumb(run_id: str, failure: Undeliverable, redactor: Redactor | None = None) -> dict[str, object]:
    """The fields of the one ``undeliverable`` line an undeliverable call leaves: run id,
    endpoint, attempted status, attempt count and the failure's class. Never a secret
    (allowlisted scalar fields, redacted with the run's keys)."""
    data = {
        "run_id": run_id,
        "endpoint": failure.endpoint,
        "attempted_status": failure.attempted_status,
        "attempts": failure.attempts,
        "reason": failure.reason,
    }
    return diagnostic_fields(data, redactor or Redactor(()))


def live(base_url: str, run_id: str, run_key: str, *, unix_socket: str | None = None) -> JobOutcome:
    client = ControlPlaneClient(base_url, run_id, run_key, on_retry=_log_retry, unix_socket=unix_socket)
    try:
        # One instance id per runner process: a replayed hello is the same claim.
        session = client.call("POST", "hello", body={"instance_id": str(uuid.uuid4())})
        client.authenticate(session["session_token"])
        job = client.call("GET", "bundle")["job"]
    except TransportError as exc:
        raise Undeliverable.from_transport(exc) from None
    redactor = Redactor((job.get("secrets") or {}).values(), keys=[run_key, session["session_token"]])
    use_redactor(redactor)  # every line from here on: the job's secrets and the session are known
    stream = EventStream(client, redactor=redactor)
    steering = Steering(
        lambda on_retry: _steer_client(base_url, run_id, session["session_token"], unix_socket, on_retry),
        stream.emit,
    )
    outcome = run_job(job, stream, steering=steering)
    failure = stream.close()
    if failure is not None and outcome.status == "succeeded":
        outcome = JobOutcome("failed", outcome.exit_code, "events could not be delivered to the control plane")
    try:
        report_result(client, outcome, redactor)
    except TransportError as exc:
        raise Undeliverable.from_transport(exc, outcome.status) from None
    return outcome


def _steer_client(base_url: str, run_id: str, token: str, unix_socket: str | None, on_retry) -> ControlPlaneClient:  # type: ignore[no-untyped-def]
    def both(endpoint: str, attempt: int, reason: str) -> None:
        on_retry(endpoint, attempt, reason)
        _log_retry(endpoint, attempt, reason)

    return ControlPlaneClient(base_url, run_id, token, on_retry=both, unix_socket=unix_socket)


def _make_non_dumpable() -> None:
    """The job runs under our uid: without this it could read our environment (the key)
    from /proc or attach to us. Best effort off Linux."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("non_dumpable_unavailable")


def _read_key(fd_text: str) -> str:
    """The key from the host's pipe, which is closed at once: the job never inherits it."""
    try:
        fd = int(fd_text)
        chunks = []
        while chunk := os.read(fd, _MAX_KEY_BYTES):
            chunks.append(chunk)
        os.close(fd)
    except (ValueError, OSError):
        return ""
    return b"".join(chunks).decode("utf-8", errors="replace").strip()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        names = ", ".join(ENV_NAMES)
        print(f"usage: python -m runner (inputs come from the environment: {names})", file=sys.stderr)
        return 2
    # Before the key is read: from here on /proc/<our pid>/ belongs to root.
    _make_non_dumpable()
    # Taken out of the environment at once, so nothing started later can inherit them.
    values = {name: os.environ.pop(name, "") for name in ENV_NAMES}
    key_fd = os.environ.pop(KEY_FD_ENV, "")
    unix_socket = os.environ.pop(SOCKET_ENV, "") or None
    if key_fd and not values["HOLDFAST_RUN_KEY"]:
        values["HOLDFAST_RUN_KEY"] = _read_key(key_fd)
    missing = [name for name, value in values.items() if not value]
    if missing:
        log.error("missing_inputs", extra=fields(names=",".join(missing)))
        return 2
    use_redactor(Redactor((), keys=[values["HOLDFAST_RUN_KEY"]]))
    log.info("started", extra=fields(run_id=values["HOLDFAST_RUN_ID"], pid=os.getpid()))
    run_id = values["HOLDFAST_RUN_ID"]
    try:
        outcome = live(
            values["HOLDFAST_CONTROL_PLANE_URL"], run_id, values["HOLDFAST_RUN_KEY"], unix_socket=unix_socket
        )
    except Undeliverable as failure:
        # One line, coordinates only, no traceback: the run's outcome could not reach the
        # control plane within its budget. Reconcile finds the run by its host's probe.
        redactor = Redactor((), keys=[values["HOLDFAST_RUN_KEY"]])
        log.error("undeliverable", extra=fields(**breadcrumb(run_id, failure, redactor)))
        return 1
    log.info("finished", extra=fields(status=outcome.status, exit_code=outcome.exit_code))
    return 0 if outcome.status == "succeeded" else 1
