"""A fan-out and its fan-in: resize 100 images, then build one album from their results.

Run from the repository root, against a running node (``make run``):

    ORBIT_CREDENTIALS_FILE=var/dev.credentials.json .venv/bin/python examples/album/main.py

It creates its own queue and submits, in one ``POST /v1/tasks/batch``
(``OrbitClient.submit_fan_in``), 100 ``image.resize`` tasks and one ``album.build`` task
that depends on all of them (``depends_on_keys``): the album waits (state ``waiting``)
until every resize has succeeded, and the node releases it in the Finish of the last one.
Its handler reads the resizes' results (``await task.parents()``) and sums them. The same
graph is submitted again (nothing new is created). Expected output:

    submitted=101 created=101 resubmitted_created=0 album_state_at_submit=waiting
    album: images=100 width_sum=25000 height_sum=16395 pixels=4098750 parents_read=100
    album_ran_after_every_resize=true

Bounded to 120 s; on any failure it prints one line on stderr and exits non-zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from orbit_sdk import OrbitClient, SubmitTaskRequest, Worker, WorkerTask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import main, run_id, serving  # noqa: E402

IMAGES = 100
CAPACITY = 16


def resized(n: int) -> tuple[int, int]:
    """Image n, 500 px wide and from 300 to 366 px high, scaled to half."""
    return 250, (300 + (n % 67)) // 2 + (n % 2)


async def scenario() -> tuple[list[str], bool]:
    run = run_id()
    resize_handler, album_handler = f"image.resize.{run}", f"album.build.{run}"
    resize_entered: list[float] = []
    album_entered: list[float] = []

    async with OrbitClient.from_env() as client:
        queue = await client.create_queue(f"album-example-{run}")
        worker = Worker.from_env(queues=[queue.queue_id], capacity=CAPACITY, client_name="album-example")

        @worker.handler(resize_handler, "v1", "v1")
        async def resize(task: WorkerTask) -> dict:
            resize_entered.append(trio.current_time())
            width, height = resized(task.payload["n"])
            return {"image": task.payload["image"], "width": width, "height": height}

        @worker.handler(album_handler, "v1", "v1")
        async def album(task: WorkerTask) -> dict:
            album_entered.append(trio.current_time())
            images = await task.parents()
            return {
                "images": len(images),
                "width_sum": sum(i.result["width"] for i in images),
                "height_sum": sum(i.result["height"] for i in images),
                "pixels": sum(i.result["width"] * i.result["height"] for i in images),
            }

        def request(handler: str, payload: dict) -> SubmitTaskRequest:
            return SubmitTaskRequest(
                queue_id=queue.queue_id, handler=handler, handler_version="v1", payload_version="v1", payload=payload
            )

        parts = [
            (f"album-{run}-img-{n}", request(resize_handler, {"n": n, "image": f"img-{n}.png"})) for n in range(IMAGES)
        ]
        join = (f"album-{run}", request(album_handler, {"title": "example"}))
        fan = await client.submit_fan_in(parts, join)
        again = await client.submit_fan_in(parts, join)
        async with serving(worker):
            await worker.wait_finished(IMAGES + 1)
        built = await client.get_task(fan.join.task_id)

        results = [*fan.parts, fan.join]
        created = sum(item.created for item in results)
        created_again = sum(item.created for item in [*again.parts, again.join])
        expected = [resized(n) for n in range(IMAGES)]
        truth = {
            "images": IMAGES,
            "width_sum": sum(w for w, _ in expected),
            "height_sum": sum(h for _, h in expected),
            "pixels": sum(w * h for w, h in expected),
        }
        after = bool(album_entered) and len(resize_entered) == IMAGES and album_entered[0] >= max(resize_entered)
        r = built.result or {}
        lines = [
            f"submitted={len(results)} created={created} resubmitted_created={created_again} "
            f"album_state_at_submit={fan.join.state}",
            f"album: images={r.get('images')} width_sum={r.get('width_sum')} height_sum={r.get('height_sum')} "
            f"pixels={r.get('pixels')} parents_read={len(built.depends_on)}",
            f"album_ran_after_every_resize={'true' if after else 'false'}",
        ]
        as_expected = (
            created == IMAGES + 1
            and created_again == 0
            and fan.join.state == "waiting"
            and built.state == "succeeded"
            and r == truth
            and len(built.depends_on) == IMAGES
            and after
        )
        return lines, as_expected


if __name__ == "__main__":
    sys.exit(main(scenario, limit_s=120))
