"""The page handlers, one module per area (sign-in, tenants, keys, models, reports)."""
