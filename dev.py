#!/usr/bin/env python3
"""Set-up and entry point for a fresh machine with only Python 3.11+.

    python3 dev.py demo    install what Holdfast needs, then run its main job on the
                           embedded default (SQLite + filesystem broker, nothing else)
    python3 dev.py test    install what the tests need, then run the whole suite
                           (PostgreSQL and Redis on 127.0.0.1; see README.md)
    python3 dev.py bench   run bench/run.py (docs/benchmarks.md) on whatever database and
                           broker the environment names (the embedded default if none)

Both create ``.venv`` beside this file on first use and reinstall only what changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

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
        return subprocess.call([str(PY), "-m", "pytest", *argv[1:]])
    print(__doc__)
    return 0 if command in {"help", "-h", "--help"} else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
