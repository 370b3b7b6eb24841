"""The engine worker process: one engine on one device behind an internal HTTP API.

`wire` (torch-free: records, frames, key names) is what the gateway's
dispatcher shares with it; `app`, `registration` and `process` run the worker.
"""
