"""Cost reconciliation: what the devices cost while held, against what requests were charged."""
