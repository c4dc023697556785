"""How a prepared sandbox's waiter reads its code: to the length its header gives, since
the host keeps its end of the pipe open (a sandbox killed before it read a byte must be
told apart by what it left unread); nothing for a pipe closed empty; and no part of a
code cut short, whatever arrived of it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sandbox_host import waiter

ROOT = Path(__file__).resolve().parents[2]


def test_the_code_is_read_to_its_length_while_the_host_s_end_stays_open():
    code = b"print('x')\n" * 20_000  # 220 KB: more than a pipe holds, so read in parts
    read_end, write_end = os.pipe()
    header = waiter.header(1 << 30, 10, len(code))
    writer = threading.Thread(target=lambda: [os.write(write_end, part) for part in (header[:3], header[3:], code)])
    writer.start()
    try:
        line, got = waiter.read_payload(read_end)  # would block for ever if it waited for EOF
    finally:
        writer.join()
    assert (line, got) == (header.rstrip(b"\n"), code)
    with pytest.raises(BrokenPipeError):  # it closed its end once it had the code
        os.write(write_end, b"more")
    os.close(write_end)


def test_a_pipe_closed_with_nothing_in_it_is_a_sandbox_let_go_unused():
    read_end, write_end = os.pipe()
    os.close(write_end)
    assert waiter.read_payload(read_end) == (b"", b"")


@pytest.mark.peer
def test_code_cut_short_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')\n".encode() + b"#" * 100
    script = (
        "import os, sys\n"
        "from sandbox_host import waiter\n"
        "r, w = os.pipe()\n"
        f"os.write(w, waiter.header(1 << 30, 10, {len(code) + 1}) + {code!r})\n"  # one byte short
        "os.close(w)\n"
        "waiter.serve(r, -1)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert not marker.exists()
