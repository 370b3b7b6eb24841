"""Dispatch to pools of engine workers: registry, routing, scale to zero and back, hot swap."""
