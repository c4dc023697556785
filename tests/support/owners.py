"""The owners the suite's tests submit work for. Work is refused for an unknown owner
(controlplane/owners/admission.py): a test that submits work uses the ``owners``
fixture (tests/conftest.py), or its directory's conftest does it for every test with
database access (``use_in_database_tests``). Tests about owners create their own."""

from __future__ import annotations

SUITE_OWNERS = (
    "a",
    "acme",
    "globex",
    "o",
    "t",
    "binary-test",
    "deploy-test",
    "ops-test",
    "outage-test",
    "push-test",
    "quota-test",
    "refused-test",
    "restart-test",
)


def create_suite_owners() -> dict:
    """SUITE_OWNERS (weight 1, the deployment's default caps), by name."""
    from controlplane.owners.actions import ensure

    return {name: ensure(name) for name in SUITE_OWNERS}


def use_in_database_tests(request) -> None:
    """For a directory's autouse fixture: create the owners when the test may touch the
    database, after pytest-django set it up (getfixturevalue runs ``owners`` then)."""
    marked = request.node.get_closest_marker("django_db") is not None
    if marked or {"db", "transactional_db"} & set(request.fixturenames):
        request.getfixturevalue("owners")
