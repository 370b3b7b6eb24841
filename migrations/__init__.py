"""Alembic environment and versions for SQLite and PostgreSQL (see platform/db/migrate.py)."""
