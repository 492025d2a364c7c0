"""The console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which ``make test`` installs) driven by Selenium against a real node
on this test's database.

Selenium blocks, so every browser step runs in a thread (``trio.to_thread``) while the node
serves in the test's own trio loop. Every check waits for what the page shows
(WebDriverWait on the condition itself, which reads the element again at each try): the
live refresh replaces a panel's elements every 2 s, so an element found once may be gone
by the time it is read. Waits are also on the page's own poll counter
(``body[data-polls]``), never on a fixed sleep. Screenshots
of each page go to ``var/console-screenshots/`` (ignored by git).
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from orbit_node.services import default_services
from orbit_node.store.plans import PlanStore
from orbit_node.store.tenancy import TenancyStore
from orbit_sdk.worker import Worker, WorkerTask

from .. import seed
from ..integration.test_console import submit
from ..nodeutil import make_tenant, make_token, run_node

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = REPO / "var" / "console-screenshots"
# The network of a test machine is closed: nothing of the browser's own may try it.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
# Longest wait for something the page should show (a poll is every 2 s).
WAIT_S = 20
MISSING = "0" * 32
T = TypeVar("T")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    if not CHROMEDRIVER.exists() or not CHROMIUM.exists():
        pytest.fail("headless Chromium is missing: `make test` installs Debian's chromium and chromium-driver")
    with tempfile.TemporaryDirectory(prefix="orbit-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            yield driver
        finally:
            driver.quit()


async def step(fn: Callable[..., T], *args: Any) -> T:
    """One blocking browser step, in a thread, while the node keeps serving."""
    return await trio.to_thread.run_sync(functools.partial(fn, *args))


# An element read while the live refresh replaces it is stale (or briefly missing): try again.
REPLACED = (NoSuchElementException, StaleElementReferenceException)


# What chromedriver says instead of a stale element when the node it was reading is
# replaced in the middle of the read (seen once in five loaded runs).
DETACHED = "does not belong to the document"


def wait(driver: WebDriver, condition: Callable[[WebDriver], Any], what: str) -> Any:
    """Until ``condition`` returns something true (returned); each try reads the page anew."""

    def attempt(d: WebDriver) -> Any:
        try:
            return condition(d)
        except WebDriverException as exc:
            if DETACHED in str(exc):
                return False
            raise

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=REPLACED).until(attempt, message=what)


def text(selector: str) -> Callable[[WebDriver], str]:
    return lambda d: d.find_element(By.CSS_SELECTOR, selector).text


def shows(selector: str, *parts: str) -> Callable[[WebDriver], bool]:
    """The element's text holds every one of ``parts``."""
    return lambda d: all(part in d.find_element(By.CSS_SELECTOR, selector).text for part in parts)


def attributes(selector: str, name: str) -> Callable[[WebDriver], list[str | None]]:
    return lambda d: [e.get_attribute(name) for e in d.find_elements(By.CSS_SELECTOR, selector)]


def shot(driver: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def polls(driver: WebDriver) -> int:
    return int(driver.execute_script("return Number(document.body.dataset.polls || 0)"))


def after_next_poll(driver: WebDriver) -> None:
    seen = polls(driver)
    wait(driver, lambda d: polls(d) > seen, "the page polled its panel again")


def sign_in(driver: WebDriver, base_url: str, token: str) -> None:
    driver.get(base_url + "/console")
    wait(driver, lambda d: "/console/sign-in" in d.current_url, "redirected to sign-in")
    shot(driver, "sign-in")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form.sign-in button").click()
    wait(driver, lambda d: d.current_url == base_url + "/console", "the overview after sign-in")


def bar_count(driver: WebDriver, queue_id: str, level: int) -> int | None:
    try:
        bar = driver.find_element(By.CSS_SELECTOR, f'tr[data-queue-id="{queue_id}"] g.bar[data-level="{level}"]')
    except NoSuchElementException:
        return None
    return int(bar.get_attribute("data-count") or 0)


def main_html(driver: WebDriver) -> str:
    return str(wait(driver, lambda d: d.find_element(By.TAG_NAME, "main").get_attribute("innerHTML"), "the page"))


@pytest.mark.time_cap(300)
async def test_the_console_in_chromium(running_node, db, browser):
    base = running_node.base_url
    shop = await make_tenant(db, "shop", queues=("orders", "reports", "emails", "inbox"))
    rival = await make_tenant(db, "rival")
    orders = shop.queues["orders"]
    async with running_node.client(shop.token) as api:
        for n, priority in enumerate((9, 5, 5, 2, 0, 0, 0)):
            created = await api.post(
                "/v1/tasks",
                json=submit(shop.queues["reports"], priority=priority),
                headers={"Idempotency-Key": f"r{n}"},
            )
            assert created.status_code == 201
        assert (await api.post(f"/v1/queues/{shop.queues['emails']}/pause", json={})).status_code == 200

        # Sign in; the overview shows the backlog per priority level.
        await step(sign_in, browser, base, shop.token)
        await step(wait, browser, lambda d: bar_count(d, orders, 7) == 0, "no priority-7 task of orders")
        await step(wait, browser, lambda d: bar_count(d, shop.queues["reports"], 5) == 2, "two priority-5 reports")
        await step(browser.execute_script, "window.orbitSamePage = true")

        # Tasks submitted now appear in the bars without a reload.
        for n in range(3):
            created = await api.post("/v1/tasks", json=submit(orders, priority=7), headers={"Idempotency-Key": f"o{n}"})
            assert created.status_code == 201
        await step(wait, browser, lambda d: bar_count(d, orders, 7) == 3, "three priority-7 tasks in the bars")
        assert await step(browser.execute_script, "return window.orbitSamePage === true")
        await step(wait, browser, shows(f'tr[data-queue-id="{shop.queues["emails"]}"]', "paused"), "emails paused")
        await step(shot, browser, "overview")

        # A task with markup in its payload and in an attempt's error; one attempt failed.
        markup = "<script>window.orbitInjected = true</script><b>bold</b>"
        inbox = shop.queues["inbox"]
        created = await api.post(
            "/v1/tasks", json=submit(inbox, {"note": markup}, priority=3), headers={"Idempotency-Key": "m"}
        )
        task_id = created.json()["data"]["task_id"]
    store = seed.lease_store(db)
    owner = seed.Tenant(shop.application_id, shop.namespace_id, inbox)
    (attempt,) = await store.claim(seed.claim_request(owner))
    assert attempt.task_id == task_id
    await store.start(task_id, attempt.fencing_token)
    error = {"code": "BOOM", "message": "<img src=x onerror=window.orbitInjected=true>"}
    await store.finish(task_id, attempt.fencing_token, error=error, retryable=True)
    # Its retry is due in an hour (a chosen time: the explanation says NOT_DUE however slow the page).
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET available_at = NOW(6) + INTERVAL 1 HOUR WHERE task_id = %s", (task_id,)
        )
    )

    await step(browser.get, f"{base}/console/tasks/{task_id}")
    await step(wait, browser, lambda d: text("#task-priority")(d) == "3", "the task's priority")
    await step(
        wait, browser, lambda d: attributes("#attempts tr[data-attempt]", "data-outcome")(d) == ["retry"], "one retry"
    )
    # Backing off, and no Worker serves it.
    await step(
        wait,
        browser,
        lambda d: {"NOT_DUE", "NO_CAPABLE_WORKER"} <= set(attributes("#explanation li", "data-code")(d)),
        "the explanation's reasons",
    )
    await step(
        wait,
        browser,
        shows("#explanation", "not due for another", "no connected Worker serves this queue"),
        "the explanation's text",
    )
    # Markup is shown as text: no element came of it and nothing ran.
    await step(wait, browser, shows("#payload", markup), "the payload as text")
    await step(
        wait, browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#payload *, #attempts img") == [], "no markup"
    )
    await step(wait, browser, shows("#attempts", "<img src=x onerror=window.orbitInjected=true>"), "error as text")
    assert await step(browser.execute_script, "return window.orbitInjected === undefined")
    await step(shot, browser, "task")

    # Fairness: claim turns of every application (the credential holds metrics:read), live.
    node_id = "f" * 32
    await db.run(
        lambda tx: tx.execute_raw(
            "INSERT INTO nodes (node_id, hostname, http_addr, version) VALUES (%s, 'node-a', '10.0.0.1:8080', 'dev')",
            (node_id,),
        )
    )
    await step(browser.get, f"{base}/console/fairness")
    for round_ in range(1, 6):
        for application_id, per_round in ((shop.application_id, 40), (rival.application_id, 40)):
            await db.run(
                lambda tx, a=application_id, t=per_round * round_: tx.execute_raw(
                    "INSERT INTO claim_turns (node_id, application_id, turns) VALUES (%s, %s, %s) "
                    "ON DUPLICATE KEY UPDATE turns = VALUES(turns)",
                    (node_id, a, t),
                )
            )
        await step(after_next_poll, browser)
    await step(wait, browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turn-chart polyline")) == 2, "two lines")
    await step(wait, browser, shows("#turn-legend", "shop:", "rival:", "50.0 % of the turns shown"), "the turn legend")
    await step(wait, browser, shows("#turns", "50.0 %"), "the turn table")
    await step(shot, browser, "fairness")

    # Plans and Workers.
    plan = await PlanStore(db).create(shop.namespace_id, orders, "nightly")
    await step(browser.get, f"{base}/console/plans")
    await step(wait, browser, shows("#plans", "nightly"), "the plan listed")
    await step(shot, browser, "plans")
    await step(browser.get, f"{base}/console/plans/{plan.plan_id}")
    await step(shot, browser, "plan")
    await step(browser.get, f"{base}/console/workers")
    await step(shot, browser, "workers")
    await step(browser.get, f"{base}/console/queues/{orders}")
    await step(
        wait,
        browser,
        lambda d: attributes('#live svg.bars g.bar[data-level="7"]', "data-count")(d) == ["3"],
        "three priority-7 tasks on the queue's page",
    )
    await step(shot, browser, "queue")

    # Another tenant's queue renders the page of a missing one.
    await step(browser.get, f"{base}/console/queues/{rival.queue_id}")
    theirs = await step(main_html, browser)
    await step(shot, browser, "not-found")
    await step(browser.get, f"{base}/console/queues/{MISSING}")
    assert await step(main_html, browser) == theirs
    assert "There is no queue with this id in your namespace." in theirs and rival.queue_id not in theirs

    # A revoked credential is signed out by the next poll of an open page.
    await step(browser.get, f"{base}/console")
    await step(after_next_poll, browser)
    await TenancyStore(db).revoke_credential(shop.token[4:36])
    await step(
        wait, browser, lambda d: "/console/sign-in?ended=revoked" in d.current_url, "signed out after revocation"
    )
    await step(wait, browser, shows("#sign-in-message", "revoked"), "why the session ended")
    await step(shot, browser, "signed-out")
    await step(browser.get, f"{base}/console")
    assert "/console/sign-in" in await step(lambda: browser.current_url)


def click(selector: str) -> Callable[[WebDriver], bool]:
    """Click the element (found anew at each try: the live refresh may have replaced it)."""

    def go(driver: WebDriver) -> bool:
        driver.find_element(By.CSS_SELECTOR, selector).click()
        return True

    return go


def live_bodies(driver: WebDriver) -> list[int]:
    """The body size in bytes of each live refresh the page has fetched (0 for a 304)."""
    return list(
        driver.execute_script(
            "return performance.getEntriesByType('resource')"
            ".filter(e => e.name.includes('fragment=live')).map(e => e.encodedBodySize)"
        )
    )


@pytest.mark.time_cap(300)
async def test_the_console_writes_in_chromium(running_node, db, browser):
    """Pause and resume a queue, cancel a task, read the audit, find tasks by the beginning
    of their id and page through them; a 1 MB payload and a long error stay short on the
    page; a read-only credential sees no button."""
    base = running_node.base_url
    shop = await make_tenant(db, "shop", queues=("orders", "reports"))
    reader = await make_token(db, shop, {"tasks:read": "*"})
    orders, reports = shop.queues["orders"], shop.queues["reports"]
    async with running_node.client(shop.token) as api:
        created = await api.post("/v1/tasks", json=submit(orders), headers={"Idempotency-Key": "c"})
        target = created.json()["data"]["task_id"]
    # 30 tasks whose ids begin with the next minute's time (ids.time_ordered_id): none other does.
    batch = f"{(int(time.time() * 1000) >> 16) + 1:08x}"
    await seed.bulk_insert_tasks(db, seed.Tenant(shop.application_id, shop.namespace_id, orders), 30, id_prefix=batch)
    # A task with a payload over 1 MB whose first attempt failed with a long traceback.
    in_reports = seed.Tenant(shop.application_id, shop.namespace_id, reports)
    big = json.dumps({"rows": [{"n": n, "text": "lorem ipsum " * 5} for n in range(12_000)]})
    assert len(big) > 1_000_000
    heavy = await seed.insert_task(db, in_reports, payload=big)
    store = seed.lease_store(db)
    (attempt,) = await store.claim(seed.claim_request(in_reports, limit=1))
    await store.start(heavy, attempt.fencing_token)
    trace = "Traceback (most recent call last):\n" + '  File "handler.py", line 7, in run\n' * 400
    await store.finish(heavy, attempt.fencing_token, error={"code": "CRASH", "message": trace}, retryable=True)
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET available_at = NOW(6) + INTERVAL 1 HOUR WHERE task_id = %s", (heavy,)
        )
    )

    await step(sign_in, browser, base, shop.token)
    orders_row = f'tr[data-queue-id="{orders}"]'
    # 31 due tasks of orders, and no Worker connected.
    await step(wait, browser, shows(f'{orders_row} [data-code="NO_CAPABLE_WORKER"]', "no Worker for 31 due"), "warning")
    await step(wait, browser, click(f'{orders_row} form[data-action="pause"] button'), "pause clicked")
    await step(wait, browser, lambda d: d.current_url == base + "/console?done=paused", "back on the overview")
    await step(wait, browser, shows("#action-message", "Queue paused"), "the answer")
    await step(wait, browser, shows(orders_row, "paused"), "orders paused")
    await step(shot, browser, "paused")
    await step(wait, browser, click(f'{orders_row} form[data-action="resume"] button'), "resume clicked")
    await step(wait, browser, shows("#action-message", "Queue resumed"), "the answer")

    await step(browser.get, f"{base}/console/tasks/{target}")
    await step(wait, browser, click('#task-actions form[data-action="cancel"] button'), "cancel clicked")
    await step(wait, browser, shows("#action-message", "Task cancelled"), "the answer")
    await step(wait, browser, lambda d: text("#task-state")(d) == "cancelled", "the task cancelled")
    await step(
        wait,
        browser,
        lambda d: attributes("#task-actions form.action", "data-action")(d) == ["retry"],
        "no cancel button left; a retry button",
    )
    await step(shot, browser, "cancelled")

    await step(browser.get, f"{base}/console/audit")
    await step(
        wait,
        browser,
        lambda d: (
            attributes("#audit tr[data-audit-id]", "data-action")(d) == ["task.cancel", "queue.resume", "queue.pause"]
        ),
        "three audit records, newest first",
    )
    await step(wait, browser, shows("#audit", shop.token[4:36], "(you)"), "who did it")
    await step(shot, browser, "audit")

    # Search by the beginning of an id, then the next page; the refresh keeps the search.
    await step(browser.get, f"{base}/console/tasks")
    await step(lambda: browser.find_element(By.ID, "task-id").send_keys(batch.upper()))
    await step(lambda: browser.find_element(By.CSS_SELECTOR, "#task-search button").click())
    found = attributes("#live tr[data-task-id]", "data-task-id")
    await step(wait, browser, lambda d: len(found(d)) == 25, "a page of 25")
    assert all(task_id.startswith(batch) for task_id in await step(found, browser))
    await step(wait, browser, click("#older-tasks"), "older clicked")
    await step(wait, browser, lambda d: len(found(d)) == 5, "the 5 older ones")
    await step(after_next_poll, browser)
    await step(after_next_poll, browser)
    assert len(await step(found, browser)) == 5
    await step(shot, browser, "search")

    # The heavy task: a short page, a refresh of a few KiB, its error readable.
    await step(browser.get, f"{base}/console/tasks/{heavy}")
    await step(wait, browser, shows("#payload-cut", "the whole payload"), "the payload's link")
    height = await step(browser.execute_script, "return document.documentElement.scrollHeight")
    assert height < 6000, height
    await step(after_next_poll, browser)
    await step(after_next_poll, browser)
    bodies = await step(live_bodies, browser)
    assert len(bodies) >= 2 and max(bodies) < 20_000, bodies
    error = "#attempts tr.attempt-error pre"
    width = await step(lambda: browser.find_element(By.CSS_SELECTOR, error).size["width"])
    assert width > 800, width
    await step(wait, browser, shows(error, "CRASH", 'File "handler.py", line 7'), "the error readable")
    await step(shot, browser, "heavy-task")
    await step(wait, browser, click("#attempts p.cut a"), "the whole error")
    await step(wait, browser, lambda d: d.page_source.count("handler.py") == 400, "the whole error shown")

    # Sign out (a form with the session's token), then a read-only credential: no button.
    await step(browser.get, f"{base}/console")
    await step(wait, browser, click("header .who form button"), "sign-out clicked")
    await step(wait, browser, shows("#sign-in-message", "signed out"), "signed out")
    await step(sign_in, browser, base, reader)
    await step(wait, browser, shows(orders_row, "orders"), "the overview")
    for path in ("/console", f"/console/queues/{orders}", f"/console/tasks/{heavy}"):
        await step(browser.get, base + path)
        await step(wait, browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#live") != [], path)
        assert await step(lambda: browser.find_elements(By.CSS_SELECTOR, "form.action")) == [], path
    await step(shot, browser, "read-only")


@pytest.mark.time_cap(300)
async def test_a_filtered_bulk_retry_in_chromium_runs_the_tasks_again(node_config, db, browser):
    """Sign in, filter the failed tasks, retry them all after the confirmation's count, and
    watch a Worker run them again."""
    shop = await make_tenant(db, "shop", queues=("orders",))
    owner = seed.Tenant(shop.application_id, shop.namespace_id, shop.queue_id)
    # Five tasks of handler h whose only attempt failed, and one of another handler.
    failed = await seed.insert_tasks(db, owner, [seed.TaskSpec(max_attempts=1, attempts=1)] * 5)
    other = await seed.insert_task(db, owner, handler="other", max_attempts=1, attempts=1)
    await db.run(
        lambda tx: tx.execute_raw(
            "UPDATE tasks SET state = 'failed', finished_at = NOW(6) WHERE task_id IN %s", (tuple([*failed, other]),)
        )
    )
    ran: list[str] = []
    async with run_node(node_config, services=default_services()) as node, trio.open_nursery() as nursery:
        base = node.base_url
        worker = Worker(url=base, token=shop.token, queues=[shop.queue_id], capacity=5)

        @worker.handler("h", "v1", "v1")
        async def run(task: WorkerTask) -> dict:
            ran.append(task.task_id)
            return {"ran": True}

        await nursery.start(worker.run)
        await step(sign_in, browser, base, shop.token)

        # The failed tasks, filtered by handler.
        await step(browser.get, f"{base}/console/failed")
        await step(lambda: browser.find_element(By.ID, "task-handler").send_keys("h"))
        await step(lambda: browser.find_element(By.CSS_SELECTOR, "#task-search button[type=submit]").click())
        rows = attributes("#live tr[data-task-id]", "data-task-id")
        await step(wait, browser, lambda d: sorted(rows(d)) == sorted(failed), "the five failed tasks of h")
        await step(shot, browser, "failed-filtered")

        # Retry them all: the confirmation counts them first.
        await step(wait, browser, click("#bulk-retry"), "retry clicked")
        await step(wait, browser, shows("#bulk-count", "5 tasks"), "the count")
        await step(shot, browser, "bulk-confirm")
        await step(wait, browser, click("#bulk-submit"), "confirmed")
        await step(wait, browser, shows("#action-message", "5 tasks retried as new tasks"), "the answer")

        # The retries run: the task list shows them succeeded, live.
        await step(browser.get, f"{base}/console/tasks?handler=h&state=succeeded")
        await step(wait, browser, lambda d: len(rows(d)) == 5, "five retries succeeded")
        retries = await step(rows, browser)
        assert sorted(ran) == sorted(retries) and not set(retries) & set(failed)
        await step(shot, browser, "retried")
        nursery.cancel_scope.cancel()
    states = await seed.count_states(db)
    assert (states["failed"], states["succeeded"]) == (6, 5)
