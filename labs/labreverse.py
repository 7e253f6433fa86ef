"""A pytest plugin that runs the collected tests in reverse order (`-p labreverse`).

The labs' meta-test runs every lab against the reference this way too: a lab test that
passes only after another one ran (a cache, a global, a seeded generator shared between
tests) fails here instead of in a student's `-k` run.
"""

from __future__ import annotations


def pytest_collection_modifyitems(session, config, items) -> None:
    items.reverse()
