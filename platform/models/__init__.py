"""Model deployments: which checkpoints the platform serves and whether they can be served."""
