"""The dashboard in a real browser: headless Chromium follows a training server.

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them) and selenium
(the dev extra). Saves a screenshot to ``test-artifacts/dashboard.png`` and prints its path.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rlserve import PolicyClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "browser-s3cret"
SMALL_PPO = (
    "--ppo-train-batch-size",
    "256",
    "--ppo-minibatch-size",
    "128",
    "--ppo-num-epochs",
    "1",
    "--fragment-length",
    "16",
    "--checkpoint-every",
    "2",
)
SCREENSHOT = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard.png"
WAIT = 45.0
"""Seconds the page may take to show what the test waits for."""


def _train(address: str, stop: threading.Event, errors: list[BaseException]) -> None:
    """Play CartPole episodes through the server until ``stop``."""
    try:
        env = gym.make("CartPole-v1")
        with PolicyClient(address, inference_mode="remote", token=TOKEN, timeout=30) as client:
            seed = 0
            while not stop.is_set():
                obs, _ = env.reset(seed=seed)
                seed += 1
                eid = client.start_episode()
                while not stop.is_set():
                    obs, reward, terminated, truncated, _ = env.step(client.get_action(eid, obs))
                    client.log_returns(eid, float(reward))
                    if terminated or truncated:
                        break
                client.end_episode(eid, obs, truncated=not terminated)
        env.close()
    except BaseException as exc:
        errors.append(exc)


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.fail(
            "headless Chromium is missing: run 'make test' (it installs them) or "
            "'apt-get install chromium chromium-driver'"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _points(driver: Any, series: str) -> int:
    element = driver.find_element("id", f"chart-{series}")
    return int(element.get_attribute("data-points") or 0)


def _rows(driver: Any, table: str) -> int:
    return len(driver.find_elements("css selector", f"#{table} tbody tr"))


def test_dashboard_fills_and_updates_in_a_browser(launch_server: Any, browser: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    server = launch_server("--token", TOKEN, "--seed", "5", *SMALL_PPO)
    stop, errors = threading.Event(), []
    trainer = threading.Thread(target=_train, args=(server.address, stop, errors), daemon=True)
    trainer.start()
    try:
        wait = WebDriverWait(browser, WAIT, poll_frequency=0.25)
        # Signing in with the form: the browser's own POST passes the Origin check.
        browser.get(f"{server.http_url}/")
        browser.find_element("id", "token").send_keys(TOKEN)
        browser.find_element("id", "sign-in").click()
        wait.until(lambda d: d.find_elements("id", "charts"))
        assert TOKEN not in browser.current_url
        browser.get_log("browser")  # drops the sign-in page's expected 401 from the log
        wait.until(lambda d: d.find_element("id", "link").text == "live")
        wait.until(lambda d: _points(d, "return_mean") >= 2 and _rows(d, "clients") >= 1)
        wait.until(lambda d: _points(d, "policy_loss") >= 1 and _points(d, "kl") >= 1)
        assert _rows(browser, "policies") == 1
        assert _rows(browser, "server") >= 5
        assert "default" in browser.find_element("css selector", "#policies tbody tr").text
        assert browser.find_element("id", "health").text == "ok"

        # Live: the figures move on without a reload.
        steps = browser.find_element("id", "env-steps").text
        points = _points(browser, "return_mean")
        wait.until(lambda d: d.find_element("id", "env-steps").text != steps)
        wait.until(lambda d: _points(d, "return_mean") > points)
        wait.until(
            lambda d: (
                "ckpt" in d.find_element("css selector", "#policies tbody tr").text
                or ".pt" in d.find_element("css selector", "#policies tbody tr").text
            )
        )

        # A link with the token: traded for the cookie, and dropped from the address.
        browser.delete_all_cookies()
        browser.get(f"{server.http_url}/?token={TOKEN}")
        assert TOKEN not in browser.current_url
        assert browser.current_url.rstrip("/") == server.http_url.rstrip("/")
        wait.until(lambda d: d.find_element("id", "link").text == "live")
        wait.until(lambda d: _points(d, "return_mean") >= 2)  # the history, at once

        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT))
        print(f"dashboard screenshot: {SCREENSHOT}")

        problems = [
            entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"
        ]
        assert not problems, problems
    finally:
        stop.set()
        trainer.join(timeout=30)
    assert not errors, errors
