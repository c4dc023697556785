"""A FAKE sandbox host for the launch task, named as such: the real host's launch is
wired with the host work. It keeps the host contract the task relies on (launch is
idempotent by run id) and records what it was given in HOLDFAST_TEST_LAUNCH_DIR, so a
test in another process can see each launch. ``<run id>.fail`` holds how many attempts
to refuse as unavailable first; ``<run id>.refuse`` makes every attempt a refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

from controlplane.runs.launcher import LaunchAck, LaunchRefused, LaunchRequest, LaunchUnavailable


class RecordingHost:
    def __init__(self) -> None:
        self.dir = Path(os.environ["HOLDFAST_TEST_LAUNCH_DIR"])

    def launch(self, request: LaunchRequest) -> LaunchAck:
        attempts_file = self.dir / f"{request.run_id}.attempts"
        attempts = int(attempts_file.read_text()) + 1 if attempts_file.exists() else 1
        attempts_file.write_text(str(attempts))
        if (self.dir / f"{request.run_id}.refuse").exists():
            raise LaunchRefused("fake host refuses")
        fail = self.dir / f"{request.run_id}.fail"
        if fail.exists() and attempts <= int(fail.read_text()):
            raise LaunchUnavailable("fake host unavailable")
        record = self.dir / f"{request.run_id}.launched"
        already = record.exists()
        if not already:  # idempotent by run id: one sandbox per run, whatever the retries
            record.write_text(json.dumps({"key": request.launch_key, "url": request.control_plane_url}))
        return LaunchAck(host_id="fake-host-1", sandbox_ref=f"sbx-{request.run_id}", already_launched=already)
