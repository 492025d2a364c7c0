"""A raw Worker-protocol client for tests: every frame the node sends is schema-checked."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

from trio_websocket import open_websocket_url

from .protocol_schema import validate_message

CAP = {"handler": "h", "handler_version": "v1", "payload_version": "v1"}


class RawWorker:
    def __init__(self, ws):
        self.ws = ws
        self.inbox: list[dict] = []

    async def send(self, message: dict) -> None:
        await self.ws.send_message(json.dumps(message))

    async def recv(self) -> dict:
        message = json.loads(await self.ws.get_message())
        validate_message(message, direction="node")
        return message

    async def recv_type(self, kind: str) -> dict:
        """The next message of ``kind``; others are kept in ``inbox``."""
        for i, message in enumerate(self.inbox):
            if message["type"] == kind:
                return self.inbox.pop(i)
        while True:
            message = await self.recv()
            if message["type"] == kind:
                return message
            self.inbox.append(message)

    async def hello(self, queues, *, capacity=1, capabilities=(CAP,), resource_keys=False, tasks=None) -> dict:
        """Send a hello (``tasks``: running tasks to re-attach) and return the welcome."""
        hello = {
            "type": "hello",
            "queues": list(queues),
            "capabilities": list(capabilities),
            "capacity": capacity,
            "resource_keys": resource_keys,
        }
        if tasks is not None:
            hello["tasks"] = list(tasks)
        await self.send(hello)
        return await self.recv_type("welcome")

    async def request(self, kind: str, tasks: list[dict], message_id: str) -> dict:
        await self.send({"type": kind, "id": message_id, "tasks": tasks})
        others = []
        try:
            while True:
                ack = await self.recv_type("ack")
                if ack.get("id") == message_id:
                    return ack
                # Another ack (of an earlier message, of a drain): kept for later readers.
                others.append(ack)
        finally:
            self.inbox.extend(others)


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/v1/workers/connect"


@asynccontextmanager
async def raw_worker(base_url: str, token: str):
    headers = [(b"authorization", f"Bearer {token}".encode())]
    async with open_websocket_url(ws_url(base_url), extra_headers=headers) as ws:
        yield RawWorker(ws)


async def heartbeat_roundtrip(worker: RawWorker) -> None:
    await worker.send({"type": "heartbeat"})
    await worker.recv_type("heartbeat")
