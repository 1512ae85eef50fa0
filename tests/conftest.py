"""Shared test setup. Fixture modules are registered here, one per area."""

pytest_plugins = [
    # The declared components (PostgreSQL, Chromium, Ray, fla/Triton, ...): the `requires`
    # marker and require()/missing(); a missing one skips locally and fails under CI.
    "components",
    # Database fixtures: sqlite_url, postgres_url, db_url (both), db_engine; fake result builders.
    "db_fixtures",
]
