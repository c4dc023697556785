#!/usr/bin/env python3
"""Set-up and entry point for a fresh machine with only Python 3.11+.

    python3 dev.py demo    install what Holdfast needs, then run its main job on the
                           embedded default (SQLite + filesystem broker, nothing else)
    python3 dev.py test    install what the tests need, then run the whole suite
                           (PostgreSQL and Redis on 127.0.0.1; see README.md); with
                           arguments, one pytest session with those arguments
    python3 dev.py bench   run bench/run.py (docs/benchmarks.md) on whatever database and
                           broker the environment names (the embedded default if none)

Both create ``.venv`` beside this file on first use and reinstall only what changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import venv
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def ensure_venv(requirements: str) -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py must explain itself on an old Python
        sys.exit(f"Holdfast needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    req = ROOT / requirements
    text = req.read_text() + (ROOT / "requirements.txt").read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()
    stamp = VENV / f".installed-{requirements}"
    if stamp.exists() and stamp.read_text() == digest:
        return
    print(f"installing {requirements}", flush=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(req)], check=True)
    stamp.write_text(digest)


# The suite's scenarios marked ``apart`` (minutes of a database or proxy outage, spent
# waiting on the clock) run in a second pytest session beside the rest, so the whole
# suite takes about their length less. That session has a database and Redis db
# numbers of its own (tests/settings.py runs suites side by side that way): the
# environment's database name with this suffix, and two dbs on its Redis,
# HOLDFAST_TEST_APART_REDIS_DBS ("broker,cache") where these would clash.
APART_DATABASE_SUFFIX = "_apart"
APART_REDIS_DBS = "3,4"  # the suite's own default is 9 and 10
# After a Ctrl-C, how long each session may take to tear down (its hosts, workers
# and test database) before it is killed.
INTERRUPTED_GRACE_S = 30.0


def _redis_db(url: str) -> str:
    return urlsplit(url).path.strip("/") or "0"


def apart_env() -> dict[str, str]:
    """The environment of the ``apart`` session, from this one's (or the suite's
    defaults). Exits if its Redis dbs are this session's."""
    database = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/holdfast"))
    broker_url = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/9")
    cache_url = os.environ.get("HOLDFAST_CACHE_URL", broker_url.rsplit("/", 1)[0] + "/10")
    broker_db, cache_db = os.environ.get("HOLDFAST_TEST_APART_REDIS_DBS", APART_REDIS_DBS).split(",")
    taken = {_redis_db(broker_url), _redis_db(cache_url)}
    if {broker_db, cache_db} & taken:
        sys.exit(f"dev.py test: Redis dbs {broker_db},{cache_db} are this session's; set HOLDFAST_TEST_APART_REDIS_DBS")
    broker = urlsplit(broker_url)
    return {
        **os.environ,
        "DATABASE_URL": urlunsplit(database._replace(path=database.path.rstrip("/") + APART_DATABASE_SUFFIX)),
        "CELERY_BROKER_URL": urlunsplit(broker._replace(path=f"/{broker_db}")),
        "HOLDFAST_CACHE_URL": urlunsplit(broker._replace(path=f"/{cache_db}")),
    }


class _Terminated(KeyboardInterrupt):
    """dev.py itself got SIGTERM: its sessions did not."""


def _terminated(*_: object) -> None:
    raise _Terminated


def test_whole_suite() -> int:
    """Both sessions at once; the ``apart`` one's report follows the other's."""
    env = apart_env()
    signal.signal(signal.SIGTERM, _terminated)
    with tempfile.TemporaryFile() as report:
        apart = subprocess.Popen([str(PY), "-m", "pytest", "-m", "apart"], env=env, stdout=report, stderr=report)
        rest = subprocess.Popen([str(PY), "-m", "pytest", "-m", "not apart"])
        try:
            rest_code, apart_code = rest.wait(), apart.wait()
            return rest_code or apart_code
        except KeyboardInterrupt as interrupt:
            # A Ctrl-C reached both sessions already (one process group); a SIGTERM
            # to dev.py did not: they are interrupted as a Ctrl-C would.
            for session in (rest, apart) if isinstance(interrupt, _Terminated) else ():
                with contextlib.suppress(ProcessLookupError):
                    session.send_signal(signal.SIGINT)
            for session in (rest, apart):
                try:
                    session.wait(INTERRUPTED_GRACE_S)
                except subprocess.TimeoutExpired:
                    session.kill()
                    session.wait()
            return 130
        finally:
            report.seek(0)
            print("\n== the scenarios marked apart, run beside the rest ==", flush=True)
            sys.stdout.buffer.write(report.read())
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "help"
    os.chdir(ROOT)
    if command == "demo":
        ensure_venv("requirements.txt")
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
        return subprocess.call([str(PY), "manage.py", "demo", *argv[1:]], env=env)
    if command == "bench":
        ensure_venv("requirements.txt")
        return subprocess.call([str(PY), "bench/run.py", *argv[1:]])
    if command == "test":
        ensure_venv("requirements-dev.txt")
        if len(argv) == 1:
            return test_whole_suite()
        return subprocess.call([str(PY), "-m", "pytest", *argv[1:]])
    print(__doc__)
    return 0 if command in {"help", "-h", "--help"} else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
