"""Shared test setup. Fixture modules are registered here, one per area."""

import os

# The reference cache is off unless a test turns it on (tests/test_refcache.py): a test that
# plants a change in the oracle must compute it, and runs in tests must not fill ~/.cache.
# Set before any test starts a subprocess, which inherits it.
os.environ.setdefault("CONVMATRIX_REFERENCE_CACHE", "off")

pytest_plugins = [
    # The declared components (PostgreSQL, Chromium, Ray, fla/Triton, ...): the `requires`
    # marker and require()/missing(); a missing one skips locally and fails under CI.
    "components",
    # Database fixtures: sqlite_url, postgres_url, db_url (both), db_engine; fake result builders.
    "db_fixtures",
]
