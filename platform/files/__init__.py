"""OpenAI's Files API (`/v1/files`): a tenant's uploads and its batches' output files."""
