"""The history page in a real browser: headless Chromium (Debian's package) driven by
Playwright with ``executable_path``; no network, no console error, the cases and a known change
point on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main
from scaleguard.history import database as history
from tests.unit.test_history import KEY, nights

pytestmark = pytest.mark.timeout(300)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "the history page test needs Chromium: apt-get install -y chromium (README, the test command)"
    )


def make_page(tmp_path: Path) -> Path:
    db = tmp_path / "h.sqlite"
    with history.History(db) as h:
        for i, (level, torch) in enumerate([(0.1, "2.13.0")] * 8 + [(0.115, "2.14.1")] * 8):
            h.append(nights([level], torch=torch, first=i), KEY, "suite")
            h.append(nights([level * 0.6], case_ws=2, torch=torch, first=100 + i), KEY, "suite")
    page = tmp_path / "history.html"
    assert cli_main(["history", "--history", str(db), "--html", str(page)]) == 0
    return page


def test_the_page_is_self_contained_and_renders_in_a_browser(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    page_file = make_page(tmp_path)
    text = page_file.read_text()
    assert "https://" not in text.split("<body>")[1] or "cdn" not in text  # no fetched script
    assert "<script src=" not in text
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_file.as_uri())
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        body = page.inner_text("body")
        assert "m-ddp-ws1-fp32-strong" in body and "m-ddp-ws2-fp32-strong" in body
        assert "Open regressions" in body and "torch 2.13.0 -> 2.14.1" in body
        plots = page.locator(".js-plotly-plot").count()
        assert plots >= 3  # step time per case, efficiency of ws2, the scaling curve
        # a change point's annotation is drawn in the step-time plot
        assert page.locator("text=torch 2.13.0 -> 2.14.1").count() >= 1
        page.select_option("select[name=ws]", "2")
        assert page.locator(".case:visible").count() == 1
        page.screenshot(path=str(tmp_path / "history.png"), full_page=False)
        browser.close()
    assert not errors, errors
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests
    assert (tmp_path / "history.png").stat().st_size > 10_000
