"""Waiting until a node serves a credential: ``orbit-admin bootstrap --when-ready``.

``make run`` starts the node and, beside it, a bootstrap that writes the development
credentials file only once the node at the file's ``url`` answers ``GET /readyz`` with
200 *and* accepts the file's token (``GET /v1/queues``): a node that failed to start
(its port taken, a bad setting) leaves an existing file exactly as it was, and a node
of another database answering on that port (it refuses the token) does not count.
"""

from __future__ import annotations

import os
import ssl

import httpx
import trio

# How often the node is asked again, and how long one question may take.
POLL_S = 0.2
PROBE_TIMEOUT_S = 2.0


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def verification(env: dict[str, str] | None = None) -> ssl.SSLContext | bool:
    """The system's trust store, plus the node's own certificate (ORBIT_TLS_CERT) when it
    serves HTTPS, so a development node's self-signed certificate is trusted."""
    env = dict(os.environ) if env is None else env
    cert = env.get("ORBIT_TLS_CERT")
    if not cert:
        return True
    context = ssl.create_default_context()
    context.load_verify_locations(cert)
    return context


async def serves(client: httpx.AsyncClient, url: str, token: str) -> bool:
    """The node at ``url`` is ready and accepts ``token``."""
    try:
        ready = await client.get(f"{url}/readyz")
        if ready.status_code != 200:
            return False
        probe = await client.get(f"{url}/v1/queues", params={"limit": 1}, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return False
    return probe.status_code == 200


async def wait_until_served(url: str, token: str, *, timeout_s: float, node_pid: int | None) -> str | None:
    """None once the node at ``url`` serves ``token``; otherwise why it did not: the
    process ``node_pid`` ended first, or ``timeout_s`` passed."""
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, verify=verification()) as client:
        with trio.move_on_after(timeout_s):
            while True:
                if await serves(client, url, token):
                    return None
                if node_pid is not None and not process_alive(node_pid):
                    return f"the node (process {node_pid}) exited before it served {url}"
                await trio.sleep(POLL_S)
    return f"no node served {url} within {timeout_s:g} s"
