"""The wire package is neutral ground: standard library only (DESIGN.md, Layout)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WIRE = Path(__file__).resolve().parents[2] / "holdfast_wire"


def test_the_wire_package_imports_only_the_standard_library_and_itself():
    foreign = set()
    for path in WIRE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "holdfast_wire":
                    foreign.add(f"{path.name}: {name}")
    assert not foreign, sorted(foreign)
