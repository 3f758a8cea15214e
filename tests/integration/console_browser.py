"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, installed with apt-get when
missing) driven by Selenium, for the web console's tests.

The console is served by the test's own event loop, so every WebDriver call, which blocks until
the browser has the page, runs in a worker thread (``Browser``'s methods are async for that).
``ORBIT_CONSOLE_SCREENSHOTS=DIR`` saves the screenshots the tests name into DIR (docs/console/)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT_S = 10.0
CLICK_ATTEMPTS = 3
WINDOW = "1280,900"
T = TypeVar("T")


def ensure_chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver, installing Debian's packages when either is missing."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium is not None, "apt-get installed no chromium"
    assert driver is not None, "apt-get installed no chromedriver"
    return chromium, driver


def start_chromium() -> webdriver.Chrome:
    chromium, driver = ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WINDOW}", "--disable-extensions", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def _button(label: str) -> str:
    """A button by its text or, where the text is short, its accessible name (aria-label)."""
    return f'//button[normalize-space()="{label}" or @aria-label="{label}"]'


class Browser:
    def __init__(self, driver: webdriver.Chrome, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url
        shots = os.environ.get("ORBIT_CONSOLE_SCREENSHOTS")
        self.screenshots = Path(shots) if shots else None

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    async def go(self, path: str) -> None:
        await self._run(lambda: self.driver.get(self.base_url + path))

    async def reload(self) -> None:
        await self._run(self.driver.refresh)

    async def path(self) -> str:
        """The page's path (read in a thread as well: the browser may be waiting for this loop)."""
        return str(await self._run(lambda: self.driver.current_url)).removeprefix(self.base_url)

    async def type(self, field_id: str, text: str, *, enter: bool = False) -> None:
        """Type into the field labelled ``field_id`` (Enter at the end submits its form)."""

        def run() -> None:
            field = WebDriverWait(self.driver, WAIT_S).until(
                expected_conditions.element_to_be_clickable((By.ID, field_id))
            )
            field.clear()
            field.send_keys(text + (Keys.RETURN if enter else ""))

        await self._run(run)

    async def choose(self, select_id: str, value: str) -> None:
        await self._run(lambda: Select(self.driver.find_element(By.ID, select_id)).select_by_value(value))

    async def press(self, button_text: str) -> None:
        """Click the button whose text is ``button_text`` and wait for the next page."""

        def run() -> None:
            old = self._click(By.XPATH, _button(button_text))
            WebDriverWait(self.driver, WAIT_S).until(expected_conditions.staleness_of(old))

        await self._run(run)

    def _click(self, by: str, what: str) -> WebElement:
        """Click the element once it can be; the page's root it was clicked on. The document can
        still be replaced under a just-loaded page (Chromium answers "Node … does not belong to
        the document"): then the new one's element is clicked."""
        for attempt in range(CLICK_ATTEMPTS):
            try:
                root = self.driver.find_element(By.TAG_NAME, "html")
                WebDriverWait(self.driver, WAIT_S).until(
                    expected_conditions.element_to_be_clickable((by, what))
                ).click()
                return root
            except WebDriverException as e:  # (a StaleElementReferenceException is one)
                replaced = isinstance(e, StaleElementReferenceException) or "does not belong to the document" in str(e)
                if not replaced or attempt == CLICK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def tick(self, css: str) -> None:
        """Click a checkbox (no page change)."""
        await self._run(lambda: self._click(By.CSS_SELECTOR, css))

    async def press_and_confirm(self, button_text: str) -> str:
        """Click a button whose form asks first (console.js), accept, wait; the question asked."""

        def run() -> str:
            old = self._click(By.XPATH, _button(button_text))
            alert = WebDriverWait(self.driver, WAIT_S).until(expected_conditions.alert_is_present())
            question = str(alert.text)
            alert.accept()
            WebDriverWait(self.driver, WAIT_S).until(expected_conditions.staleness_of(old))
            return question

        return await self._run(run)

    async def follow(self, link_text: str) -> None:
        def run() -> None:
            old = self._click(By.LINK_TEXT, link_text)
            WebDriverWait(self.driver, WAIT_S).until(expected_conditions.staleness_of(old))

        await self._run(run)

    async def text(self, css: str = "main") -> str:
        return str(await self._run(lambda: self.driver.find_element(By.CSS_SELECTOR, css).text))

    async def attribute(self, css: str, name: str) -> str:
        return str(await self._run(lambda: self.driver.find_element(By.CSS_SELECTOR, css).get_attribute(name)))

    async def texts(self, css: str) -> list[str]:
        return await self._run(lambda: [str(e.text) for e in self.driver.find_elements(By.CSS_SELECTOR, css)])

    async def source(self) -> str:
        return str(await self._run(lambda: self.driver.page_source))

    async def screenshot(self, name: str, *, whole_page: bool = False) -> None:
        """Into ORBIT_CONSOLE_SCREENSHOTS/``name``.png when set: the window, or the whole page."""
        if self.screenshots is None:
            return
        self.screenshots.mkdir(parents=True, exist_ok=True)
        target = str(self.screenshots / f"{name}.png")

        def run() -> None:
            if not whole_page:
                self.driver.save_screenshot(target)
                return
            # The DevTools protocol's capture beyond the viewport (a headless window keeps its size).
            size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})
            Path(target).write_bytes(base64.b64decode(shot["data"]))

        await self._run(run)

    async def forget_cookies(self) -> None:
        await self._run(self.driver.delete_all_cookies)
