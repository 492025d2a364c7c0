"""Worker connections: the sans-IO protocol, the per-connection control loop, the endpoint."""
