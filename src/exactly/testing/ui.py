"""``exactly ui`` as a subprocess for tests: started on a free port, stopped afterwards; and
the headless Chromium (Debian's chromium and chromedriver, driven by Selenium) that loads it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from exactly.testing.ports import free_port


def get_json(url: str, timeout: float = 10) -> tuple[int, Any]:
    """``(status, body)`` of a GET returning JSON (error statuses too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def get_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


@contextmanager
def ui_server(*checkpoints: str | Path, timeout: float = 60,
              python: str | Path = sys.executable,
              env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``exactly ui CHECKPOINT...`` (``python -m exactly.cli``, in ``env``) on a free
    port of 127.0.0.1; yields its base URL once ``/jobs`` answers. Raises AssertionError
    with the server's output when it exits."""
    port = free_port()
    proc = subprocess.Popen([str(python), "-m", "exactly.cli", "ui",
                             *map(str, checkpoints), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                output = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"exactly ui exited with {proc.returncode}: {output}")
            try:
                if get_json(f"{base}/jobs", timeout=2)[0] == 200:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError("exactly ui did not answer /jobs in time")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Selenium driver of headless Chromium (1400x2000, the browser's console log kept);
    fails the test naming the installer when chromium or chromedriver is missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is missing: run scripts/setup.sh browser (Debian "
                        "chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1400,2000", "--disable-gpu"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
