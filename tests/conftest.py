"""Shared test setup. Fixture modules are registered here, one per area."""

# Database fixtures: sqlite_url, postgres_url, db_url (both), db_engine; fake result builders.
pytest_plugins = ["db_fixtures"]
