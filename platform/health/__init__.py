"""Liveness and readiness: what load balancers and Kubernetes probes ask."""
