"""The price book: model deployments and their versioned per-million-token prices."""
