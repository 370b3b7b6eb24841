"""Database layer: SQLAlchemy 2 async models, engine/session factory, migration runner."""
