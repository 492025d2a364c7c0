"""The HTTP API (quart-trio) served by hypercorn's trio worker."""
