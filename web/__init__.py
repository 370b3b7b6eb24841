"""Server-rendered admin and tenant pages, served by the gateway under `/ui`."""
