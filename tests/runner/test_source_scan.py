"""The policy table is checked against what the runner's source actually does, not snapshotted:
every endpoint the runner calls is classified, and only transport.py can make a request."""

from __future__ import annotations

import ast
import pathlib

import pytest

from runner.policy import CONSERVATIVE_DEFAULT, ENDPOINT_POLICIES, policy_for

RUNNER = pathlib.Path(__file__).resolve().parents[2] / "runner"
TRANSPORT = "transport.py"
# Modules that can open a connection or make a request; only transport.py may import them.
NETWORK_MODULES = ("socket", "ssl", "http", "urllib.request", "asyncio", "selectors", "importlib")
NETWORK_MODULES += ("requests", "httpx", "urllib3", "aiohttp", "websocket", "websockets")
# Every endpoint in the table is called from the runner's entry point.
NOT_YET_CALLED: set[str] = set()
ENTRY_POINT = "__main__.py"


def called_endpoints(source: str, filename: str) -> set[str]:
    """Endpoint names of every ``<x>.call(METHOD, "endpoint", ...)`` in ``source``; a call whose
    endpoint is not a literal cannot be classified and fails the scan."""
    found = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call":
            if (
                len(node.args) < 2
                or not isinstance(node.args[1], ast.Constant)
                or not isinstance(node.args[1].value, str)
            ):
                raise AssertionError(f"{filename}:{node.lineno}: endpoint must be a literal so it can be classified")
            found.add(node.args[1].value)
    return found


def _references(node: ast.AST) -> set[str]:
    """Every name a node mentions: plain names, and attribute names (``stream.emit``,
    ``target=self._drain``), so calls, thread targets and callbacks all count."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def reachable(sources: dict[str, str], entry: str = ENTRY_POINT) -> tuple[set[str], list[ast.AST]]:
    """Functions and classes reachable from ``entry``'s module-level code, following
    references by name across the runner's modules (an over-approximation: a name that
    matches is followed, so nothing reachable is missed). Returns the reachable names
    and the nodes whose code runs (the entry's module code and every reachable def)."""
    trees = {name: ast.parse(source, name) for name, source in sources.items()}
    defs: dict[str, list[ast.AST]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defs.setdefault(node.name, []).append(node)
    roots = [n for n in trees[entry].body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    seen: set[str] = set()
    running: list[ast.AST] = list(roots)
    todo = [name for root in roots for name in _references(root)]
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        for node in defs[name]:
            running.append(node)
            todo.extend(_references(node))
    return seen, running


def reachable_endpoints(sources: dict[str, str]) -> set[str]:
    """Endpoints of the ``.call`` sites in code reachable from the runner's entry point."""
    _, running = reachable(sources)
    found: set[str] = set()
    for node in running:
        found |= called_endpoints(ast.unparse(node), "reachable")
    return found


def network_imports(source: str, filename: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            names.add("__import__")
    return {n for n in names if n == "__import__" or any(n == m or n.startswith(m + ".") for m in NETWORK_MODULES)}


def runner_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(RUNNER.glob("*.py"))}


def test_every_endpoint_the_runner_calls_is_classified() -> None:
    called: set[str] = set()
    for name, source in runner_sources().items():
        called |= called_endpoints(source, name)
    assert "events" in called, "the scan found nothing: it is not looking where the calls are"
    unclassified = sorted(e for e in called if e not in ENDPOINT_POLICIES)
    assert unclassified == [], (
        f"add these to runner/policy.py with the server behaviour that justifies them: {unclassified}"
    )


def test_every_table_entry_is_called_or_known_to_be_pending() -> None:
    """Counted only where the runner's entry point can reach: a helper nobody calls does
    not make its endpoint "called"."""
    called = reachable_endpoints(runner_sources())
    assert {"hello", "bundle", "events", "result"} <= called
    assert set(ENDPOINT_POLICIES) - called == NOT_YET_CALLED


def test_no_runner_function_is_a_dead_end() -> None:
    """Every function and class in runner/ is reachable from ``python -m runner``."""
    sources = runner_sources()
    names, _ = reachable(sources)
    defined = {
        node.name
        for name, source in sources.items()
        for node in ast.walk(ast.parse(source, name))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    assert defined - names == set()


def test_the_reachability_scan_ignores_a_helper_nobody_calls() -> None:
    sources = {
        "__main__.py": "from runner.main import main\nmain()\n",
        "main.py": (
            "def main():\n    client.call('POST', 'hello')\n    worker(target=pump)\n"
            "def pump():\n    client.call('POST', 'events')\n"
            "def save_state(client):\n    return client.call('POST', 'session-state')\n"
        ),
    }
    assert reachable_endpoints(sources) == {"hello", "events"}
    assert "save_state" not in reachable(sources)[0]


def test_only_the_transport_can_make_a_request() -> None:
    offenders = {
        name: sorted(found)
        for name, source in runner_sources().items()
        if name != TRANSPORT and (found := network_imports(source, name))
    }
    assert offenders == {}
    assert network_imports(runner_sources()[TRANSPORT], TRANSPORT), "the scan should see transport.py's imports"


def test_every_entry_says_why() -> None:
    for name, policy in ENDPOINT_POLICIES.items():
        assert len(policy.why) > 30, name


def test_unknown_endpoints_get_the_conservative_default() -> None:
    assert policy_for("not-in-the-table") is CONSERVATIVE_DEFAULT
    assert not CONSERVATIVE_DEFAULT.replay_safe
    assert policy_for("result?x=1").budget_s > policy_for("events").budget_s


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import urllib.request\nurllib.request.urlopen('http://x')", "urllib.request"),
        ("from http.client import HTTPConnection", "http.client"),
        ("import socket", "socket"),
        ("m = __import__('socket')", "__import__"),
    ],
)
def test_the_bypass_scan_catches_a_request_outside_the_transport(source: str, why: str) -> None:
    assert why in network_imports(source, "bad.py")


def test_the_endpoint_scan_rejects_a_computed_endpoint() -> None:
    with pytest.raises(AssertionError):
        called_endpoints("name = 'ev' + 'ents'\nclient.call('POST', name)", "bad.py")
    assert called_endpoints("client.call('POST', 'brand-new')", "ok.py") == {"brand-new"}
