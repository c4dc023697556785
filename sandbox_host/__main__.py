"""``python -m sandbox_host --listen HOST:PORT [--host-id ID] [--drain-grace-s N]
[--auth-timeout-s N] [--max-concurrent N] [--max-runs N] [--max-pre-auth N]
[--max-pre-auth-per-peer N] [--tls-cert PEM --tls-key PEM] [--state-dir DIR] [--isolation NAME]``.

The token comes from ``HOLDFAST_SANDBOX_TOKEN`` only (never argv, which ``ps`` shows).
Exit codes: 0 after a SIGTERM drain, 2 for a usage or configuration error.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import secrets
import signal
import socket
import ssl
import sys

from . import defaults, uids
from .isolation import WARNINGS, Isolation, probe, sweep_leftovers, works
from .log import configure, log
from .server import Host, Settings
from .template_host import Template, TemplateUnavailable

TOKEN_ENV = "HOLDFAST_SANDBOX_TOKEN"  # noqa: S105 - the variable name, not a token
PR_SET_DUMPABLE = 4


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError("expected HOST:PORT, e.g. 127.0.0.1:8765 (PORT may be 0)")
    return host, int(port)


def _positive(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _make_non_dumpable() -> None:
    """With PR_SET_DUMPABLE 0, /proc/<our pid>/environ and /mem are owned by root and
    unreadable to other uids (and ptrace is refused), so user code that finds our pid
    still cannot read the token from our environment."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _with_template(isolation: Isolation, choice: str) -> Isolation:
    """``isolation`` with its warm template started and proven (``works``), or as it is
    for ``--template off`` (and ``auto`` where a template cannot serve: it forks root's
    children into the slot uids, so it needs a root host with the full sandbox)."""
    possible = isolation.sandboxed and isolation.uid_base is not None
    if choice == "off" or (choice == "auto" and not possible):
        log("template_selected", template="off")
        return isolation
    if not possible:
        raise RuntimeError("--template on needs a root host with the full sandbox (--isolation bwrap)")
    template = Template(isolation)
    try:
        template.start()
    except TemplateUnavailable as exc:
        raise RuntimeError(f"{exc} (--template off starts each sandbox fresh instead)") from None
    isolation = dataclasses.replace(isolation, template=template)
    ok, why = works(isolation)
    if not ok:
        raise RuntimeError(f"the warm template's children are not contained as promised: {why}")
    log("template_selected", template="on", pid=template.pid)
    return isolation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox_host", description="Holdfast sandbox host")
    parser.add_argument("--listen", type=_parse_listen, required=True, help="HOST:PORT to listen on")
    parser.add_argument("--host-id", default=None, help="id reported to clients (default: random)")
    parser.add_argument(
        "--drain-grace-s",
        type=_positive,
        default=defaults.DEFAULT_DRAIN_GRACE_S,
        help="seconds in-flight executions get after SIGTERM",
    )
    parser.add_argument(
        "--auth-timeout-s",
        type=_positive,
        default=defaults.DEFAULT_AUTH_TIMEOUT_S,
        help="seconds a new connection has to authenticate",
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=defaults.DEFAULT_MAX_CONCURRENT,
        help="executions run at once; more are answered not_started(at_capacity)",
    )
    parser.add_argument(
        "--max-runs",
        type=int,
        default=defaults.DEFAULT_MAX_RUNS,
        help="run sandboxes alive at once; more launches are answered not_started(at_capacity)",
    )
    parser.add_argument(
        "--max-pre-auth",
        type=int,
        default=defaults.DEFAULT_MAX_PRE_AUTH,
        help="connections not yet authenticated, host-wide; more are refused at once",
    )
    parser.add_argument(
        "--max-pre-auth-per-peer",
        type=int,
        default=defaults.DEFAULT_MAX_PRE_AUTH_PER_PEER,
        help="connections not yet authenticated per peer address; more are refused at once",
    )
    parser.add_argument("--tls-cert", default="", help="PEM certificate chain: serve wss:// (needs --tls-key)")
    parser.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--reserve",
        type=int,
        default=defaults.DEFAULT_RESERVE_SIZE,
        help="sandboxes kept started ahead of time, each waiting for one execution's code (0: none)",
    )
    parser.add_argument(
        "--reserve-quiet-ms",
        type=int,
        default=int(defaults.DEFAULT_RESERVE_QUIET_S * 1000),
        help="refill the reserve once the host has been this quiet (sooner when it runs low)",
    )
    parser.add_argument(
        "--state-dir",
        default="",
        help="where run records live (default: holdfast-host-<host id> under the temp dir); "
        "a host restarted with the same directory (and --host-id) can probe the runs it launched",
    )
    parser.add_argument(
        "--isolation",
        default="auto",
        choices=["auto", "bwrap", "insecure-shared-uid", "insecure-rlimits"],  # --insecure-shared-dir: its own level
        help="auto and bwrap: the full sandbox (bubblewrap, root), or refuse to start; the insecure-* levels "
        "give user code less containment and are never chosen unless named here (docs/operations.md)",
    )
    parser.add_argument(
        "--insecure-shared-dir",
        default="",
        metavar="DIR",
        help="TEST HARNESSES ONLY: bind DIR read-write into every sandbox (tests count what ran through "
        "it); any user code can then read and write it",
    )
    parser.add_argument(
        "--template",
        default="auto",
        choices=["auto", "on", "off"],
        help="where sandboxes come from: on, a warm template process that forks each one (fast); off, a fresh "
        "bubblewrap sandbox and interpreter each (the fresh-interpreter path); auto: on for a root host with the "
        "full sandbox",
    )
    parser.add_argument(
        "--scratch-mb",
        type=int,
        default=defaults.DEFAULT_SCRATCH_BYTES // (1024 * 1024),
        help="writable space of one execution as a whole (its tmpfs), MiB",
    )
    args = parser.parse_args(argv)
    configure()  # one logfmt line per event on stderr, as every Holdfast process writes
    if args.max_concurrent < 1:
        parser.error("--max-concurrent must be >= 1")
    if args.max_runs < 0:
        parser.error("--max-runs must be >= 0")
    if not 0 <= args.reserve <= defaults.DEFAULT_UID_BLOCK_SIZE - args.max_concurrent:
        parser.error("--reserve must be >= 0 and fit with --max-concurrent in one uid block")
    if args.reserve_quiet_ms < 0:
        parser.error("--reserve-quiet-ms must be >= 0")
    if args.scratch_mb < 1:
        parser.error("--scratch-mb must be >= 1")
    if args.max_pre_auth < 1 or args.max_pre_auth_per_peer < 1:
        parser.error("--max-pre-auth and --max-pre-auth-per-peer must be >= 1")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")

    # Taken out of our environment so no child we start can inherit it by accident.
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        print(f"holdfast-host: {TOKEN_ENV} is empty; refusing to start without a token", file=sys.stderr)
        return 2
    if len(token) < defaults.DEFAULT_MIN_TOKEN_CHARS:
        print(
            f"holdfast-host: {TOKEN_ENV} is shorter than {defaults.DEFAULT_MIN_TOKEN_CHARS} characters; refusing a "
            "guessable token (make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')",
            file=sys.stderr,
        )
        return 2
    _make_non_dumpable()
    host_id = args.host_id or secrets.token_hex(4)

    drain = []
    signal.signal(signal.SIGTERM, lambda *_: drain and drain[0].set())

    try:
        uid_base = None
        if os.geteuid() == 0:
            # Children run under uids only this host uses; the lock fd stays open (and
            # the block ours) until the process exits.
            uid_base, _uid_lock_fd = uids.claim(args.max_concurrent + args.reserve)
        isolation = probe(
            log,
            uid_base=uid_base,
            require=None if args.isolation == "auto" else args.isolation,
            scratch_bytes=args.scratch_mb * 1024 * 1024,
            shared_dir=args.insecure_shared_dir,
        )
    except RuntimeError as exc:
        # Fail closed: one line naming what is missing; never a weaker sandbox by itself.
        print(f"holdfast-host: refusing to start: {exc}", file=sys.stderr)
        return 2
    try:
        isolation = _with_template(isolation, args.template)
    except RuntimeError as exc:
        print(f"holdfast-host: refusing to start: {exc}", file=sys.stderr)
        return 2
    if isolation.name in WARNINGS:
        print(f"holdfast-host: WARNING --isolation {isolation.name}: {WARNINGS[isolation.name]}", file=sys.stderr)
    sweep_leftovers(isolation, log)
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            tls.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            print(f"holdfast-host: cannot load --tls-cert/--tls-key: {exc.__class__.__name__}", file=sys.stderr)
            return 2
    listener = socket.create_server(args.listen, backlog=128)
    address, port = listener.getsockname()[:2]
    host = Host(
        listener=listener,
        token=token,
        host_id=host_id,
        isolation=isolation,
        settings=Settings(
            drain_grace_s=args.drain_grace_s,
            auth_timeout_s=args.auth_timeout_s,
            max_concurrent=args.max_concurrent,
            max_runs=args.max_runs,
            max_pre_auth=args.max_pre_auth,
            max_pre_auth_per_peer=args.max_pre_auth_per_peer,
            reserve=args.reserve,
            reserve_quiet_s=args.reserve_quiet_ms / 1000,
            state_dir=args.state_dir,
        ),
        tls=tls,
    )
    drain.append(host.drain_requested)
    log("host_listening", address=f"{address}:{port}", host_id=host_id, isolation=isolation.name)
    url = f"{'wss' if tls else 'ws'}://{address}:{port}"
    print(f"holdfast-host listening {url} host_id={host_id} isolation={isolation.name}", flush=True)
    host.serve()
    log("host_exited", host_id=host_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
