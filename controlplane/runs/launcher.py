"""The seam between the launch task and a sandbox host.

The task calls ``launch_on_host``; a driver carries the request to a host. The real
driver is ``host_driver.WebSocketLaunchDriver`` (the sandbox hosts' protocol), chosen
by default when ``HOLDFAST_SANDBOX_URL`` and ``HOLDFAST_SANDBOX_TOKEN`` are set;
``HOLDFAST_RUNS_LAUNCH_DRIVER`` names another (tests inject fakes that way, or with
``set_driver`` for exact interleavings). Reconcile probes hosts through the same
driver (``probe_hosts``), so a probe reaches hosts exactly as a launch does.

Host contract (what any driver must guarantee):
- A launch starts ``python -m runner`` detached in its own sandbox (the isolation of
  executions) with exactly three inputs: the run id, the launch key (the only secret it
  gets) and the control plane's URL.
- **Launch is idempotent by run id.** A second launch for a run id the host has already
  started (whether its sandbox still runs or has exited) starts nothing and answers with
  the first launch's sandbox (``already_launched=True``). The task relies on this: a
  redelivered or retried launch for a run still provisioning asks again.
- The launch key is never logged, never written to the host's disk outside the sandbox,
  and never passed to anything but the runner.

Errors::

    LaunchError
    ├── LaunchNotConfigured   no driver is configured (RUNS_LAUNCH_DRIVER, SANDBOX_URL)
    ├── LaunchUnavailable     no host could be reached, or it is draining: retry later
    └── LaunchRefused         a host refused this launch for good: the run fails
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string


class LaunchError(Exception):
    code = "launch_error"


class LaunchNotConfigured(LaunchError):
    code = "launch_not_configured"


class LaunchUnavailable(LaunchError):
    code = "launch_unavailable"


class LaunchRefused(LaunchError):
    code = "launch_refused"


@dataclass(frozen=True)
class LaunchRequest:
    run_id: str
    # repr=False: a request printed in a traceback or a log must not show the key.
    launch_key: str = field(repr=False)
    control_plane_url: str


@dataclass(frozen=True)
class LaunchAck:
    host_id: str
    sandbox_ref: str = ""
    already_launched: bool = False


@dataclass(frozen=True)
class SandboxProbe:
    """What a host said of one run's sandbox (docs/protocol.md, ``run_status``)."""

    # running | exited | unknown (this host has no record of the run)
    status: str
    exit_code: int | None = None

    @property
    def alive(self) -> bool:
        return self.status == "running"


class LaunchDriver(Protocol):
    def launch(self, request: LaunchRequest) -> LaunchAck: ...


class SandboxProber(Protocol):
    """The reconcile side of a driver: one batched probe per host.

    ``probe({host_id: [run ids]})`` answers ``{host_id: {run id: SandboxProbe}}`` for
    the hosts that answered for all their ids; a host missing from the answer did not
    answer (unreachable, timed out, an older release): its runs are left untouched."""

    def probe(self, run_ids_by_host: dict[str, list[str]]) -> dict[str, dict[str, SandboxProbe]]: ...


_override: LaunchDriver | None = None


def set_driver(driver: LaunchDriver | None) -> None:
    """Install ``driver`` for this process (tests, or the lead's wiring); None restores
    the configured one."""
    global _override
    _override = driver


def get_driver() -> LaunchDriver:
    if _override is not None:
        return _override
    if settings.RUNS_LAUNCH_DRIVER:
        return import_string(settings.RUNS_LAUNCH_DRIVER)()
    if settings.SANDBOX_URL and settings.SANDBOX_TOKEN:
        from .host_driver import WebSocketLaunchDriver

        return WebSocketLaunchDriver.from_settings()
    raise LaunchNotConfigured(
        "no launch driver configured (HOLDFAST_SANDBOX_URL and HOLDFAST_SANDBOX_TOKEN, or HOLDFAST_RUNS_LAUNCH_DRIVER)"
    )


def launch_on_host(run_id: str, launch_key: str, control_plane_url: str) -> LaunchAck:
    return get_driver().launch(LaunchRequest(run_id, launch_key, control_plane_url))


def probe_hosts(run_ids_by_host: dict[str, list[str]], driver: object | None = None) -> dict[str, dict]:
    """One batched probe per host through ``driver`` (default: the launch driver, so
    reconcile asks the hosts exactly the way launches reach them). A driver without
    ``probe`` knows no host: every host counts as silent."""
    probe = getattr(driver if driver is not None else get_driver(), "probe", None)
    return probe(run_ids_by_host) if probe is not None else {}


def stop_on_host(run_id: str, host_id: str, driver: object | None = None) -> bool:
    """Kill the run's sandbox where the driver can (a driver without ``stop`` cannot)."""
    stop = getattr(driver if driver is not None else get_driver(), "stop", None)
    return bool(stop(run_id, host_id)) if stop is not None else False
