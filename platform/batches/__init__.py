"""OpenAI's Batch API (`/v1/batches`): a file of requests run in spare capacity within a day,
each line through the interactive request path, at the batch price, exactly once."""
