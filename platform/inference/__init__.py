"""The OpenAI-compatible inference API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`."""
