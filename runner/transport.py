"""The one function every control-plane call goes through: ``ControlPlaneClient.call``.

Each attempt is split into phases so a failure says what it proves (DESIGN.md, Runs):

- connect (DNS, TCP, TLS): refused, name resolution lost, no route, connect timeout.
  No request byte was sent, so nothing reached a handler: retried for EVERY endpoint.
- send, then read the status, headers and the WHOLE body: reset, broken pipe, read
  timeout, a body cut mid-read, and 500/502/503/504. The request may have been applied,
  so these are retried only for endpoints ``runner.policy`` declares replay-safe.
- 429: the limiter answers before any handler, so it is always safe to repeat; it has its
  own count limit and its waits do not spend the outage budget.
- any other non-2xx: a real answer, never retried.

Errors (every foreign exception is translated here; callers see only this tree)::

    TransportError                     base of every runner transport failure
    ├── ServerRejected                 a final HTTP answer: status, code, message, body
    │   ├── RunTerminal                409 run_terminal: recorded_status
    │   └── RateLimited                429 beyond its retries: attempts
    ├── NotReplaySafe                  ambiguous failure on a not-replay-safe endpoint:
    │                                  endpoint, status (None for network), detail
    ├── OutageExceeded                 the outage budget is spent: endpoint, attempts, last_error
    └── BadResponse                    a 2xx whose body is not the JSON promised, or a
                                       connect failure that retrying cannot fix: endpoint, detail

Messages carry the endpoint, statuses and error classes only: never the bearer, a body
sent, or the URL's credentials.
"""

from __future__ import annotations

import errno
import http.client
import json
import random as _random
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from runner import backoff
from runner.policy import policy_for

# Network failures at connect time that are outages rather than misconfiguration.
_UNREACHABLE_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN})
_ENDPOINT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz-")


class TransportError(Exception):
    """Base of every failure a control-plane call can raise."""


class ServerRejected(TransportError):
    def __init__(self, endpoint: str, status: int, code: str, message: str, body: Any) -> None:
        super().__init__(f"{endpoint}: HTTP {status} {code}")
        self.endpoint = endpoint
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class RunTerminal(ServerRejected):
    """409 run_terminal: the run already has a verdict; ``recorded_status`` is it."""

    def __init__(self, endpoint: str, status: int, code: str, message: str, body: Any) -> None:
        super().__init__(endpoint, status, code, message, body)
        recorded = body.get("status") if isinstance(body, dict) else None
        self.recorded_status: str | None = recorded if isinstance(recorded, str) else None


class RateLimited(ServerRejected):
    def __init__(self, endpoint: str, status: int, code: str, message: str, body: Any, *, attempts: int) -> None:
        super().__init__(endpoint, status, code, message, body)
        self.attempts = attempts


class NotReplaySafe(TransportError):
    def __init__(self, endpoint: str, status: int | None, detail: str) -> None:
        super().__init__(f"{endpoint}: ambiguous failure ({detail}) and the endpoint is not replay-safe")
        self.endpoint = endpoint
        self.status = status
        self.detail = detail


class OutageExceeded(TransportError):
    def __init__(self, endpoint: str, attempts: int, last_error: str) -> None:
        super().__init__(f"{endpoint}: outage budget spent after {attempts} attempts; last: {last_error}")
        self.endpoint = endpoint
        self.attempts = attempts
        self.last_error = last_error


class BadResponse(TransportError):
    def __init__(self, endpoint: str, detail: str) -> None:
        super().__init__(f"{endpoint}: {detail}")
        self.endpoint = endpoint
        self.detail = detail


# Internal classification of one attempt's failure; never escapes this module.
class _NothingReached(Exception):
    pass


class _Ambiguous(Exception):
    pass


class _Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _describe(exc: BaseException) -> str:
    # The class and errno only: str(exc) of a foreign error may quote a URL or a header.
    err = getattr(exc, "errno", None)
    return f"{type(exc).__name__}" + (f"[{errno.errorcode.get(err, err)}]" if isinstance(err, int) else "")


class ControlPlaneClient:
    """Holds the address, run id and bearer; ``call`` is the only way to reach the control plane."""

    def __init__(
        self,
        base_url: str,
        run_id: str,
        bearer: str,
        *,
        # Timeouts
        connect_timeout_s: float = backoff.DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = backoff.DEFAULT_READ_TIMEOUT_S,
        # Limits
        rate_limit_retries: int = backoff.DEFAULT_RATE_LIMIT_RETRIES,
        # Test seams: time and chance are injected so retry tests never sleep for real.
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = _random.random,
        # Told (endpoint, attempt just failed, what failed) before each wait for a retry,
        # so the runner's log shows an outage; the reason is a class or a status, no data.
        on_retry: Callable[[str, int, str], None] | None = None,
        # A run sandbox has no network: its one way out is a Unix socket its host relays
        # to ``base_url``'s address. The URL still names the scheme, Host and path prefix
        # (and, for https, the name TLS verifies end to end through the relay).
        unix_socket: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("control plane URL must be http(s)://host[:port][/prefix]")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._prefix = parsed.path.rstrip("/")
        self._unix_socket = unix_socket
        self.run_id = str(run_id)
        self._bearer = bearer
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._rate_limit_retries = rate_limit_retries
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._random = random
        self._on_retry = on_retry or (lambda endpoint, attempt, reason: None)

    def authenticate(self, bearer: str) -> None:
        """Switch the bearer (from the launch key to the session token after hello)."""
        self._bearer = bearer

    # The one function every control-plane call goes through.
    def call(
        self,
        method: str,
        endpoint: str,
        *,
        body: Mapping[str, Any] | list[Any] | bytes | None = None,
        content_type: str = "application/octet-stream",
        query: Mapping[str, str] | None = None,
        raw: bool = False,
    ) -> Any:
        """Send ``method`` to ``{base}/internal/runs/{run_id}/{endpoint}``; return the parsed
        JSON answer, or the body bytes when ``raw``. ``body`` is JSON for a mapping or list,
        sent as is (``content_type``) for bytes. Raises only ``TransportError`` subclasses."""
        if not endpoint or not set(endpoint) <= _ENDPOINT_CHARS:
            raise ValueError(f"endpoint must be a bare name, got {endpoint!r}")
        policy = policy_for(endpoint)
        path = f"{self._prefix}/internal/runs/{urllib.parse.quote(self.run_id, safe='')}/{endpoint}"
        if query:
            path += "?" + urllib.parse.urlencode(dict(query))
        headers = {"Authorization": f"Bearer {self._bearer}", "Accept": "application/json"}
        payload: bytes | None
        if body is None:
            payload = None
        elif isinstance(body, bytes):
            payload = body
            headers["Content-Type"] = content_type
        else:
            payload = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"

        deadline = self._clock() + policy.budget_s
        attempts = 0
        retries = 0  # network and 5xx retries: the backoff exponent
        rate_limited = 0
        while True:
            attempts += 1
            try:
                answer = self._attempt(endpoint, method, path, headers, payload)
            except _NothingReached as exc:
                last = str(exc)
            except _Ambiguous as exc:
                if not policy.replay_safe:
                    raise NotReplaySafe(endpoint, None, str(exc)) from None
                last = str(exc)
            else:
                status = answer.status
                if 200 <= status < 300:
                    return answer.body if raw else self._decode(endpoint, answer)
                if status == 429:
                    if rate_limited >= self._rate_limit_retries:
                        raise RateLimited(endpoint, *self._error_fields(answer), attempts=attempts)
                    rate_limited += 1
                    wait = backoff.rate_limit_wait(self._retry_after(answer))
                    self._sleep(wait)
                    # 429 is outside the budget: its waits do not count as outage time.
                    deadline += wait
                    continue
                if status in backoff.TRANSIENT_STATUSES:
                    if not policy.replay_safe:
                        raise NotReplaySafe(endpoint, status, f"HTTP {status}")
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        # No guaranteed retry on this path: the server answered, it is up.
                        raise OutageExceeded(endpoint, attempts, f"HTTP {status}")
                    delay = backoff.backoff_delay(retries, self._random())
                    self._on_retry(endpoint, attempts, f"HTTP {status}")
                    self._sleep(backoff.server_error_wait(delay, self._retry_after(answer), remaining))
                    retries += 1
                    continue
                raise self._rejection(endpoint, answer)
            # A retryable network failure (either class, once the policy allowed it).
            wait = backoff.network_wait(
                backoff.backoff_delay(retries, self._random()), deadline - self._clock(), retries_so_far=retries
            )
            if wait is None:
                raise OutageExceeded(endpoint, attempts, last)
            self._on_retry(endpoint, attempts, last)
            self._sleep(wait)
            retries += 1

    def _attempt(
        self, endpoint: str, method: str, path: str, headers: Mapping[str, str], payload: bytes | None
    ) -> _Answer:
        """One request. Raises _NothingReached, _Ambiguous, BadResponse; else the answer,
        body read in full (reading it is part of the classification)."""
        conn: http.client.HTTPConnection
        if self._unix_socket:
            cls = _UnixHTTPSConnection if self._scheme == "https" else _UnixHTTPConnection
            conn = cls(self._unix_socket, self._host, self._port, timeout=self._connect_timeout_s)
        elif self._scheme == "https":
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._connect_timeout_s)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)
        try:
            # Phase 1: connect. Nothing is written before this returns.
            try:
                conn.connect()
            except socket.gaierror as exc:  # name resolution lost (a restarting container's DNS name)
                raise _NothingReached(f"connect: {_describe(exc)}") from None
            except ssl.SSLError as exc:  # certificate or protocol mismatch: retrying cannot fix it
                raise BadResponse(endpoint, f"connect: TLS: {_describe(exc)}") from None
            except (ConnectionRefusedError, TimeoutError, ConnectionResetError, ConnectionAbortedError) as exc:
                raise _NothingReached(f"connect: {_describe(exc)}") from None
            except OSError as exc:
                if exc.errno in _UNREACHABLE_ERRNOS:
                    raise _NothingReached(f"connect: {_describe(exc)}") from None
                raise BadResponse(endpoint, f"connect: {_describe(exc)}") from None
            assert conn.sock is not None
            conn.sock.settimeout(self._read_timeout_s)
            # Phase 2: send and read everything. From the first byte sent, any failure is ambiguous.
            try:
                conn.request(method, path, body=payload, headers=dict(headers))
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                # Covers reset, broken pipe, read timeout, RemoteDisconnected, IncompleteRead.
                raise _Ambiguous(f"exchange: {_describe(exc)}") from None
            return _Answer(response.status, response.headers, data)
        finally:
            conn.close()

    def _retry_after(self, answer: _Answer) -> float | None:
        return backoff.parse_retry_after(answer.headers.get("Retry-After"), now_epoch_s=self._wall_clock())

    @staticmethod
    def _decode(endpoint: str, answer: _Answer) -> Any:
        if not answer.body:
            return None
        try:
            return json.loads(answer.body)
        except ValueError:
            raise BadResponse(endpoint, f"HTTP {answer.status} body is not JSON") from None

    @staticmethod
    def _error_fields(answer: _Answer) -> tuple[int, str, str, Any]:
        try:
            parsed: Any = json.loads(answer.body) if answer.body else None
        except ValueError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return (
            answer.status,
            code if isinstance(code, str) else f"http_{answer.status}",
            message if isinstance(message, str) else "",
            parsed,
        )

    def _rejection(self, endpoint: str, answer: _Answer) -> ServerRejected:
        status, code, message, parsed = self._error_fields(answer)
        if status == 409 and code == "run_terminal":
            return RunTerminal(endpoint, status, code, message, parsed)
        return ServerRejected(endpoint, status, code, message, parsed)


def _unix_connect(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except FileNotFoundError:
        sock.close()
        # The relay's socket is not there yet (or is being replaced after a host
        # restart): no byte left, exactly like a refused TCP connect.
        raise ConnectionRefusedError(errno.ECONNREFUSED, "relay socket missing") from None
    except BaseException:
        sock.close()
        raise
    return sock


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to ``host:port`` carried over a Unix socket (the sandbox's relay)."""

    def __init__(self, path: str, host: str, port: int, *, timeout: float | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = _unix_connect(self._path, self.timeout)


class _UnixHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS through the relay: TLS is end to end, verified against the URL's name."""

    def __init__(self, path: str, host: str, port: int, *, timeout: float | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = _unix_connect(self._path, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)
