"""What the quantization accuracy gates measure with: next-token metrics, realistic weights.

Neither needs the engine. The gates themselves run the engine's own model
(`hydrant.engine.accuracy`), so they live in the engine: kernels never import it.
"""
