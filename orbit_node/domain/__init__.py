"""The domain: pure values and rules of the node, with no I/O (no database driver, no
HTTP or WebSocket server, no trio). Every other layer may import it; it imports nothing
of theirs."""
