"""Authentication: API keys → `Principal`; guards for inference and admin routes."""
