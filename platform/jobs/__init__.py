"""Hydrant's jobs: Celery on Redis, or the same jobs on the gateway's event loop (embedded)."""
