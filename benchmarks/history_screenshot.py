"""The README's history screenshot: a history with the real H200 recording sessions (if their
saved runs are given) and a synthetic 16-night series with a +7 % step at a torch change.

    python benchmarks/history_screenshot.py OUT.png [SAVED_RUN.json ...]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.unit.test_history import KEY, nights

from scaleguard.cli import main as cli_main
from scaleguard.history import database as history


def main() -> None:
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "h.sqlite"
        with history.History(db) as h:
            for i, (level, torch) in enumerate([(0.1, "2.13.0")] * 8 + [(0.107, "2.14.1")] * 8):
                h.append(nights([level], torch=torch, first=i), KEY, "suite")
                h.append(nights([level * 0.6], case_ws=2, torch=torch, first=100 + i), KEY, "suite")
        if sys.argv[2:]:
            cli_main(["history", "import", *sys.argv[2:], "--history", str(db)])
        page = Path(tmp) / "page.html"
        cli_main(["history", "--history", str(db), "--html", str(page), "--case", "m-*"])
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            tab = browser.new_page(viewport={"width": 1100, "height": 1000})
            tab.goto(page.as_uri())
            tab.wait_for_selector(".js-plotly-plot")
            tab.screenshot(path=str(out))
            browser.close()
    subprocess.run(["ls", "-la", str(out)], check=False)


if __name__ == "__main__":
    main()
