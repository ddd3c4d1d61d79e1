"""The confirmation page in a real headless browser (Chromium from Debian, driven by selenium):
a step-up sign-in and an approval, each opened from the address a 2026-07-28 call's
input-required answer gave, filled in and sent without any script (the page has none), and the
waiting call then completing. The browser trusts the test CA through its own NSS database.

Screenshots of the two pages go to ``$MCPD_TEST_SHOTS`` when it is set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.confirm import SIGNIN_READ_APPROVED_LIST, call, call_body, confirm_daemon, page_url
from tests.support.privsep_fixture import PrivsepDaemon

pytestmark = pytest.mark.root



@pytest.fixture(scope="module")
def browserd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """alice: files/read needs a fresh sign-in; files/list needs bob's approval."""
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/bootstrap.sh installs it)")
    with confirm_daemon(SIGNIN_READ_APPROVED_LIST) as found:
        yield found


@pytest.fixture(scope="module")
def browser(browserd: Any) -> Iterator[Any]:
    """Headless Chromium trusting the daemon's test CA (an NSS database in its own HOME)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    d, _ = browserd
    home = tempfile.mkdtemp(prefix="mcpd-chromium-")
    nss = Path(home) / ".pki/nssdb"
    nss.mkdir(parents=True)
    if shutil.which("certutil") is None:
        pytest.skip("certutil (libnss3-tools) is not installed")
    subprocess.run(["certutil", "-N", "-d", f"sql:{nss}", "--empty-password"], check=True)
    subprocess.run(["certutil", "-A", "-d", f"sql:{nss}", "-n", "mcpd-test", "-t", "C,,", "-i", d.cacert], check=True)
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=900,800", f"--user-data-dir={home}/p"):
        opts.add_argument(arg)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"), env={**os.environ, "HOME": home})
    drv = webdriver.Chrome(options=opts, service=service)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(home, ignore_errors=True)


def _shot(drv: Any, name: str) -> None:
    folder = os.environ.get("MCPD_TEST_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        drv.save_screenshot(str(Path(folder) / name))


def _fill_and_send(drv: Any, user: str, password: str, button: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    field = drv.find_element(By.NAME, "user")
    field.clear()
    field.send_keys(user)
    drv.find_element(By.NAME, "password").send_keys(password)
    drv.find_element(By.CSS_SELECTOR, f'button[value="{button}"]').click()
    # (click returns before the answer's page has loaded: wait for it, by its title)
    WebDriverWait(drv, 60).until(lambda d: d.title in ("Done", "Refused", "Busy", "Unavailable"))
    return str(drv.find_element(By.TAG_NAME, "body").text)


def test_sign_in_in_a_browser_then_the_call_completes(browserd: Any, browser: Any) -> None:
    d, pw = browserd
    first = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    browser.get(page_url(first))
    assert "Sign in to allow a privileged read" in browser.title + browser.page_source
    assert str(d.log_file) in browser.page_source
    assert browser.execute_script("return document.scripts.length") == 0
    _shot(browser, "sign-in.png")
    text = _fill_and_send(browser, d.accounts["alice"].name, pw["alice"], "signin")
    assert "signed in" in text
    retry = call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"], rid=2))
    assert retry["resultType"] == "complete" and retry["content"][0]["text"].startswith("app log line 1")


def test_approve_in_a_browser_then_the_waiting_call_completes(browserd: Any, browser: Any) -> None:
    d, pw = browserd
    first = call(d, d.tokens["alice"], call_body(str(d.app), tool="files/list", why="looking for the log"))
    browser.get(page_url(first))
    assert "Approve a privileged read" in browser.page_source and "looking for the log" in browser.page_source
    _shot(browser, "approval.png")
    text = _fill_and_send(browser, d.accounts["bob"].name, pw["bob"], "approve")
    assert "approved" in text
    retry = call(d, d.tokens["alice"], call_body(str(d.app), tool="files/list", state=first["requestState"], rid=2))
    assert retry["resultType"] == "complete" and retry.get("isError") is not True, retry
    assert "log.txt" in str(retry["content"])
