"""Hydrant's inference engine: paged KV cache, continuous batching, sampling.

Imports torch; the control plane reaches it only through `hydrant.engine.protocol`
(data types) or, in the embedded mode, through the async front.
"""
