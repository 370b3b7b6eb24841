"""Cost and usage reports over the ledger: per (bucket, tenant, model), aggregated in SQL."""
