"""The wire package is neutral ground (DESIGN.md, Layout): standard library only, and
the control plane and the host sit side by side on it, neither importing the other."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported(package: str) -> set[tuple[str, str]]:
    """(file, top-level module) for every absolute import under ``package``."""
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found.update((str(path.relative_to(ROOT)), name.split(".")[0]) for name in names)
    return found


def test_the_wire_package_imports_only_the_standard_library_and_itself():
    allowed = {*sys.stdlib_module_names, "holdfast_wire"}
    foreign = {(f, m) for f, m in imported("holdfast_wire") if m not in allowed}
    assert not foreign, sorted(foreign)


def test_the_control_plane_and_the_host_never_import_each_other():
    assert not {(f, m) for f, m in imported("controlplane") if m == "sandbox_host"}
    assert not {(f, m) for f, m in imported("sandbox_host") if m in {"controlplane", "holdfast_devtools"}}


def test_the_runner_imports_only_what_its_sandbox_binds():
    """A run's sandbox holds the standard library and two read-only packages, the runner
    and the wire (sandbox_host/runs.py): anything else would fail only inside a sandbox."""
    allowed = {*sys.stdlib_module_names, "runner", "holdfast_wire"}
    foreign = {(f, m) for f, m in imported("runner") if m not in allowed}
    assert not foreign, sorted(foreign)
