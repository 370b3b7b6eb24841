"""`GET /admin/engines`: what each served engine is configured with and holds right now."""
