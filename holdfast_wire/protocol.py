"""The worker <-> sandbox host wire protocol: typed frames, encoded as JSON text frames.

Pure functions, no I/O: the client and server sessions (``client.py``, ``server.py``)
build on it, and its tests feed it strings.
Documented frame by frame in ``docs/protocol.md``.

Compatibility rules (a worker of release N works with a host of release N-1 and the
reverse):

* every frame carries ``v`` (the sender's protocol version) and ``type``;
* a receiver ignores fields it does not know, so a newer sender may add fields;
* a receiver answers an unknown ``type`` with an ``error`` frame (code
  ``unknown_type``) and keeps the connection, so a newer sender can probe;
* a field is never removed or given a new meaning within a major version.

Runs (long-lived sandboxes that host ``python -m runner``) have their own frames, added
after the execution frames without changing any of them: ``launch_run`` ->
``run_launched`` (idempotent by run id), ``stop_run`` -> ``run_stopped``, and one
batched ``probe_runs`` -> ``run_status`` per host.

Errors::

    ProtocolError            a frame that cannot be accepted; carries ``code``
      (codes: malformed_json, not_an_object, missing_field, bad_field, unknown_type)
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

PROTOCOL_VERSION = 1

# Limits
# The first frame must be ``auth`` and must arrive within this many raw bytes, counted on
# the TCP socket from the first byte (the HTTP handshake included). 16 KiB holds any
# honest handshake plus the token; more means a client is making us buffer for nothing.
PRE_AUTH_MAX_BYTES = 16 * 1024
# Largest frame accepted after authentication (the snippet is the bulk of it).
MAX_FRAME_BYTES = 1024 * 1024
# Output kept per stream per execution; the rest is dropped and a marker appended.
MAX_OUTPUT_BYTES = 1024 * 1024
OUTPUT_TRUNCATED_MARKER = "\n[holdfast: output truncated at {limit} bytes]\n"
# Largest frame a host sends: a result with both streams full of text that needs no
# escaping, plus markers and the envelope. JSON escaping can grow output about six
# times (a control byte becomes ``\u0001``), so ``fit_result`` cuts the streams of a
# larger result until the encoded frame fits, and says so. Clients refuse anything
# larger (the worker's receive limit).
MAX_RESULT_FRAME_BYTES = 2 * MAX_OUTPUT_BYTES + 64 * 1024
RESULT_TRUNCATED_MARKER = "\n[holdfast: output truncated to fit a {limit}-byte result frame]\n"
# Longest execution id accepted: ids are ours (UUIDs), anything longer is forged.
MAX_ID_CHARS = 64
# Run ids one ``probe_runs`` may name: a reconcile tick batches a host's runs into one
# round trip; 1000 live runs on one host is far beyond what a host runs, and the answer
# stays well under MAX_FRAME_BYTES.
MAX_PROBE_IDS = 1000
# A run's launch key (the control plane's keys are ~50 characters) and the control
# plane's URL: bounded so a frame cannot make the host carry megabytes into a child's
# environment.
MAX_RUN_KEY_CHARS = 256
MAX_URL_CHARS = 2048

# Statuses a host reports for an execution it ran.
RESULT_STATUSES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
# What a host knows of a run's sandbox: its process lives, it exited, or this host has
# no record of it (never launched here, or launched under another state directory).
RUN_STATUSES = frozenset({"running", "exited", "unknown"})

# Containment levels a host reports in ``auth_ok``, weakest first (the host's ``isolation``
# says what each gives). An empty or unknown level (a host of an older release) ranks
# below all of them.
ISOLATION_LEVELS = ("insecure-rlimits", "insecure-shared-uid", "insecure-shared-dir", "bwrap")
FULL_ISOLATION = "bwrap"

# Error codes the host may put in an ``error`` frame.
ERROR_CODES = frozenset(
    {
        "malformed_json",
        "not_an_object",
        "missing_field",
        "bad_field",
        "unknown_type",
        "unauthenticated",
        "auth_failed",
        "auth_timeout",
        "frame_too_large",
        "duplicate_id",
        "unknown_id",
        "at_capacity",
        "internal",
    }
)


class ProtocolError(ValueError):
    """A frame that cannot be accepted. ``code`` is one of ``ERROR_CODES``."""

    def __init__(self, code: str, message: str, *, frame_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_id = frame_id


@dataclass(frozen=True)
class Frame:
    type: ClassVar[str] = ""
    # Field name -> expected Python type, checked by ``decode``.
    required: ClassVar[dict[str, type | tuple[type, ...]]] = {}

    def check(self) -> None:
        """Field rules beyond types, run by ``decode``; raises ``ProtocolError``."""


# --- client -> host -------------------------------------------------------------------


@dataclass(frozen=True)
class Auth(Frame):
    """First frame on every connection. The token is compared in constant time."""

    type: ClassVar[str] = "auth"
    required: ClassVar[dict] = {"token": str}
    token: str
    client: str = ""  # free-form, for the host's logs: "worker pid=123"

    def __repr__(self) -> str:  # never print the token
        return f"Auth(client={self.client!r})"


@dataclass(frozen=True)
class Execute(Frame):
    """Run ``code`` in a fresh child process and answer with one ``result``."""

    type: ClassVar[str] = "execute"
    required: ClassVar[dict] = {"id": str, "code": str, "timeout_ms": int, "memory_mb": int}
    id: str
    code: str
    timeout_ms: int
    memory_mb: int


@dataclass(frozen=True)
class Cancel(Frame):
    """Kill the execution's process group; the host answers its ``result`` (cancelled)."""

    type: ClassVar[str] = "cancel"
    required: ClassVar[dict] = {"id": str}
    id: str


@dataclass(frozen=True)
class LaunchRun(Frame):
    """Start ``python -m runner`` for run ``id`` in its own detached sandbox, or answer
    that it was already started (idempotent by run id). ``key`` is the run's launch key,
    the only secret the sandbox gets."""

    type: ClassVar[str] = "launch_run"
    required: ClassVar[dict] = {"id": str, "key": str, "control_plane_url": str}
    id: str
    key: str
    control_plane_url: str

    def __repr__(self) -> str:  # never print the key
        return f"LaunchRun(id={self.id!r}, control_plane_url={self.control_plane_url!r})"

    def check(self) -> None:
        if not 0 < len(self.key) <= MAX_RUN_KEY_CHARS or not self.key.isprintable() or " " in self.key:
            # The message never quotes the key.
            raise ProtocolError("bad_field", "launch_run.key is not a valid key", frame_id=self.id)
        url = self.control_plane_url
        if len(url) > MAX_URL_CHARS or not url.startswith(("http://", "https://")) or not url.isprintable():
            raise ProtocolError("bad_field", "launch_run.control_plane_url must be http(s)://...", frame_id=self.id)


@dataclass(frozen=True)
class StopRun(Frame):
    """Kill run ``id``'s sandbox (its whole process tree). Idempotent."""

    type: ClassVar[str] = "stop_run"
    required: ClassVar[dict] = {"id": str}
    id: str


@dataclass(frozen=True)
class ProbeRuns(Frame):
    """Ask for the status of several runs' sandboxes at once (one round trip per host).
    ``ref`` is echoed in the answer so a client may have several probes in flight."""

    type: ClassVar[str] = "probe_runs"
    required: ClassVar[dict] = {"ids": list}
    ids: list
    ref: str = ""

    def check(self) -> None:
        if len(self.ids) > MAX_PROBE_IDS:
            raise ProtocolError("bad_field", f"probe_runs.ids holds more than {MAX_PROBE_IDS} ids")
        if not all(isinstance(i, str) and _valid_id(i) for i in self.ids):
            raise ProtocolError("bad_field", "probe_runs.ids must be valid ids")
        if not isinstance(self.ref, str) or len(self.ref) > MAX_ID_CHARS:
            raise ProtocolError("bad_field", "probe_runs.ref must be a short string")


# --- host -> client -------------------------------------------------------------------


@dataclass(frozen=True)
class AuthOk(Frame):
    """``isolation`` is the host's containment level (one of ``ISOLATION_LEVELS``) and
    ``bounds`` what bounds one sandbox as a whole there (memory, processes, scratch
    space, ...): clients refuse a host below the level they require."""

    type: ClassVar[str] = "auth_ok"
    required: ClassVar[dict] = {"host_id": str}
    host_id: str
    max_frame_bytes: int = MAX_FRAME_BYTES
    draining: bool = False
    isolation: str = ""
    bounds: dict | None = None

    def check(self) -> None:
        if not isinstance(self.isolation, str) or not (self.bounds is None or isinstance(self.bounds, dict)):
            raise ProtocolError("bad_field", "auth_ok.isolation must be a string and bounds an object")


@dataclass(frozen=True)
class Started(Frame):
    """The child for ``id`` exists. Informational: the pool treats an execution as
    possibly run as soon as it sent the frame, whether or not this arrived."""

    type: ClassVar[str] = "started"
    required: ClassVar[dict] = {"id": str}
    id: str


@dataclass(frozen=True)
class Result(Frame):
    type: ClassVar[str] = "result"
    required: ClassVar[dict] = {"id": str, "status": str}
    id: str
    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_ms: int = 0
    error: str = ""


@dataclass(frozen=True)
class NotStarted(Frame):
    """The host refused ``id`` before creating any process for it (draining, at
    capacity). It provably never ran, so the pool may send it elsewhere."""

    type: ClassVar[str] = "not_started"
    required: ClassVar[dict] = {"id": str, "reason": str}
    id: str
    reason: str


@dataclass(frozen=True)
class Draining(Frame):
    """The host got SIGTERM: take no new work on this connection; in-flight work
    finishes within ``grace_ms``."""

    type: ClassVar[str] = "draining"
    required: ClassVar[dict] = {}
    grace_ms: int = 0


@dataclass(frozen=True)
class Error(Frame):
    """Bad input. ``id`` names the execution when the frame could be tied to one."""

    type: ClassVar[str] = "error"
    required: ClassVar[dict] = {"code": str, "message": str}
    code: str
    message: str
    id: str | None = None


@dataclass(frozen=True)
class RunLaunched(Frame):
    """Run ``id``'s sandbox was started by this request, or (``already``) by an earlier
    one, whether it still runs or has exited; nothing new was started then."""

    type: ClassVar[str] = "run_launched"
    required: ClassVar[dict] = {"id": str}
    id: str
    already: bool = False


@dataclass(frozen=True)
class RunStopped(Frame):
    """Run ``id``'s sandbox is gone (killed now, already exited, or never here)."""

    type: ClassVar[str] = "run_stopped"
    required: ClassVar[dict] = {"id": str}
    id: str
    was_running: bool = False


@dataclass(frozen=True)
class RunStatus(Frame):
    """Answer to ``probe_runs``: ``statuses`` maps each asked id to
    ``{"status": "running"|"exited"|"unknown", "exit_code": int | null}``."""

    type: ClassVar[str] = "run_status"
    required: ClassVar[dict] = {"statuses": dict}
    statuses: dict
    ref: str = ""


FRAME_TYPES: dict[str, type[Frame]] = {
    cls.type: cls
    for cls in (
        Auth,
        Execute,
        Cancel,
        AuthOk,
        Started,
        Result,
        NotStarted,
        Draining,
        Error,
        LaunchRun,
        StopRun,
        ProbeRuns,
        RunLaunched,
        RunStopped,
        RunStatus,
    )
}


def encode(frame: Frame) -> str:
    """Serialise a frame to the text of one WebSocket message."""
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": frame.type}
    # The fields as they are: ``asdict`` would deep-copy each value first, which cost
    # more than the JSON on every execution's path (bench/path_costs.py).
    for name in _field_names(type(frame)):
        body[name] = getattr(frame, name)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@functools.cache
def _field_names(cls: type[Frame]) -> tuple[str, ...]:
    # ``fields`` and not ``__dataclass_fields__``: the latter also lists the ClassVars
    # (``type``, ``required``), which are not fields of a frame.
    return tuple(f.name for f in fields(cls))


def decode(text: str | bytes) -> Frame:
    """Parse one message into a typed frame, ignoring unknown fields.

    Raises ``ProtocolError`` with a code the host can echo in an ``error`` frame.
    """
    try:
        body = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("malformed_json", f"frame is not valid JSON: {exc.__class__.__name__}") from None
    if not isinstance(body, dict):
        raise ProtocolError("not_an_object", "frame must be a JSON object")
    kind = body.get("type")
    frame_id = body.get("id") if isinstance(body.get("id"), str) else None
    if not isinstance(kind, str):
        raise ProtocolError("missing_field", "frame has no 'type'", frame_id=frame_id)
    cls = FRAME_TYPES.get(kind)
    if cls is None:
        raise ProtocolError("unknown_type", f"unknown frame type {kind[:40]!r}", frame_id=frame_id)
    for name, expected in cls.required.items():
        if name not in body:
            raise ProtocolError("missing_field", f"{kind} frame has no {name!r}", frame_id=frame_id)
        value = body[name]
        # bool is an int in Python; a JSON true is never a valid count.
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ProtocolError("bad_field", f"{kind}.{name} has the wrong type", frame_id=frame_id)
    known = _field_names(cls)
    kwargs = {k: v for k, v in body.items() if k in known}
    if "id" in kwargs and isinstance(kwargs["id"], str) and not _valid_id(kwargs["id"]):
        raise ProtocolError("bad_field", f"{kind}.id is not a valid id", frame_id=None)
    try:
        frame = cls(**kwargs)
    except TypeError as exc:  # an optional field of the wrong shape is still our error
        raise ProtocolError("bad_field", f"{kind} frame: {exc}", frame_id=frame_id) from None
    frame.check()
    return frame


def isolation_rank(level: str) -> int:
    """Position of ``level`` in ``ISOLATION_LEVELS``; -1 (below all) when unknown."""
    return ISOLATION_LEVELS.index(level) if level in ISOLATION_LEVELS else -1


def isolation_refusal(offered: str, required: str) -> str:
    """Why a client must not use a host offering ``offered`` when it requires
    ``required``; empty when it may."""
    if isolation_rank(offered) >= isolation_rank(required):
        return ""
    shown = offered or "none reported (a host of an older release)"
    return f"the host's isolation is {shown}, below the required {required}"


def _valid_id(value: str) -> bool:
    return 0 < len(value) <= MAX_ID_CHARS and all(c.isalnum() or c in "-_" for c in value)


def truncate_output(text: str, limit: int = MAX_OUTPUT_BYTES) -> str:
    """Cap ``text`` at ``limit`` UTF-8 bytes, appending a marker when anything was cut."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    kept = raw[:limit].decode("utf-8", errors="ignore")
    return kept + OUTPUT_TRUNCATED_MARKER.format(limit=limit)


def _encoded_len(text: str) -> int:
    """Bytes ``text`` takes inside an encoded frame (JSON string escaping, UTF-8)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", errors="replace")) - 2


def _cut_to(text: str, budget: int) -> str:
    """The longest prefix of ``text`` whose encoded length is at most ``budget``."""
    low, high = 0, len(text)
    while low < high:  # invariant: text[:low] fits; text[:high + 1] does not, or high == len
        mid = (low + high + 1) // 2
        if _encoded_len(text[:mid]) <= budget:
            low = mid
        else:
            high = mid - 1
    return text[:low]


def encode_result(frame: Result, limit: int = MAX_RESULT_FRAME_BYTES) -> str:
    """``encode(fit_result(frame, limit))``, encoding once when the frame fits (the
    usual case: a text of n characters is at most 4n bytes)."""
    text = encode(frame)
    if len(text) * 4 <= limit or len(text.encode("utf-8", errors="replace")) <= limit:
        return text
    return encode(fit_result(frame, limit))


def fit_result(frame: Result, limit: int = MAX_RESULT_FRAME_BYTES) -> Result:
    """``frame`` if its encoding fits in ``limit`` bytes; otherwise the same result with
    stdout and stderr cut (each marked with RESULT_TRUNCATED_MARKER) so that it does.
    Each stream may use half of what the rest of the frame leaves, and a stream that
    needs less than its half lends the remainder to the other."""
    if len(encode(frame).encode("utf-8", errors="replace")) <= limit:
        return frame
    marker = RESULT_TRUNCATED_MARKER.format(limit=limit)
    empty = len(encode(replace(frame, stdout="", stderr="")).encode("utf-8", errors="replace"))
    budget = max(0, limit - empty - 2 * _encoded_len(marker))
    out_cost, err_cost = _encoded_len(frame.stdout), _encoded_len(frame.stderr)
    out_budget = min(out_cost, max(budget // 2, budget - err_cost))
    err_budget = budget - out_budget
    stdout = frame.stdout if out_cost <= out_budget else _cut_to(frame.stdout, out_budget) + marker
    stderr = frame.stderr if err_cost <= err_budget else _cut_to(frame.stderr, err_budget) + marker
    return replace(frame, stdout=stdout, stderr=stderr)


__all__ = [
    "FULL_ISOLATION",
    "ISOLATION_LEVELS",
    "MAX_FRAME_BYTES",
    "MAX_OUTPUT_BYTES",
    "MAX_PROBE_IDS",
    "MAX_RESULT_FRAME_BYTES",
    "PRE_AUTH_MAX_BYTES",
    "PROTOCOL_VERSION",
    "Auth",
    "AuthOk",
    "Cancel",
    "Draining",
    "Error",
    "Execute",
    "Frame",
    "LaunchRun",
    "NotStarted",
    "ProbeRuns",
    "ProtocolError",
    "Result",
    "RunLaunched",
    "RunStatus",
    "RunStopped",
    "Started",
    "StopRun",
    "decode",
    "encode",
    "encode_result",
    "fit_result",
    "isolation_rank",
    "isolation_refusal",
    "truncate_output",
]
