"""The nmt-serve page in a real browser: headless Chromium from the system packages, driven by Playwright.

Playwright's own browser download is not used: the test points it at an installed Chromium (Debian's
`chromium` package, or $NMT_CHROMIUM) and is skipped, with the reason, where there is none. Set
NMT_SERVE_SCREENSHOT=docs/serve.png to keep the screenshot (the README's); otherwise it goes to a temporary folder.
"""

import os
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from nmt.config import ServeSettings  # noqa: E402
from nmt.serve.models import load_model  # noqa: E402
from tests.test_serve import DECODE, trained_pair, translate  # noqa: E402
from tests.test_serve_hostile import serving  # noqa: E402

# The real binary first: Debian's /usr/bin/chromium is a shell wrapper around it.
CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """$NMT_CHROMIUM, else the first Chromium found on this machine."""
    for name in filter(None, (os.environ.get("NMT_CHROMIUM"), *CANDIDATES)):
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium found (apt-get install chromium, or set NMT_CHROMIUM=/path/to/chrome)"
)


def httpx_client(base: str):
    import httpx

    return httpx.Client(base_url=base, timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory, toy_dir):
    """nmt-serve with both tiny models on a free loopback port, in a thread of this process."""
    runs = trained_pair(tmp_path_factory, toy_dir)
    models = [load_model(name, path, DECODE, torch.device("cpu")) for name, path in runs.items()]
    with serving(models, ServeSettings(access_log=False)) as (base, _):
        yield base


def test_page_translates_and_hover_highlights_attended_tokens(server, toy_dir, tmp_path):
    sentence = (toy_dir / "test.src").read_text().splitlines()[0]
    screenshot = Path(os.environ.get("NMT_SERVE_SCREENSHOT") or tmp_path / "serve.png")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(server + "/")
            page.wait_for_selector("#model option", state="attached")
            assert page.locator("#models .model-card").count() == 2
            page.fill("#text", sentence)
            page.click("#go")
            page.wait_for_selector(".panel .translation")
            page.wait_for_selector("td.cell")
            panels = page.locator(".panel")
            assert panels.count() == 2  # both models, side by side
            assert "Transformer" in panels.nth(0).inner_text() and "Luong" in panels.nth(1).inner_text()
            with httpx_client(server) as client:  # the page shows what the API answers
                for k, name in enumerate("ab"):
                    expected = translate(client, {"text": [sentence], "model": name})["translations"][0]["text"]
                    assert panels.nth(k).locator(".translation").inner_text() == expected

            first = panels.nth(0)
            assert first.locator("th.src.hl").count() == 0
            first.locator("th.tgt").first.hover()
            highlighted = first.locator("th.src.hl")
            assert highlighted.count() >= 1  # the source tokens the first target token attends to
            assert "rgba(245, 158, 11" in highlighted.first.evaluate("e => getComputedStyle(e).backgroundColor")
            assert (
                first.locator(".tok.src.hl").count() == highlighted.count()
            )  # the token strip agrees with the heat map
            first.locator("th.src").first.hover()
            assert first.locator("th.tgt.hl").count() >= 1 and first.locator("th.src.hl").count() == 0

            page.locator("th.tgt").nth(1).hover()
            page.screenshot(path=str(screenshot), full_page=True)
            assert screenshot.stat().st_size > 10_000

            page.fill("#beam", "99")  # the server's 4xx message reaches the page
            page.click("#go")
            page.wait_for_selector("#error:not([hidden])")
            assert "beam=99" in page.inner_text("#error")
        finally:
            browser.close()


WATCH = """() => {
  window.seen = [];
  new MutationObserver(() => window.seen.push({
    live: document.querySelectorAll("table.heat.live tbody tr").length,
    done: document.querySelectorAll(".panel:not(.live)").length,
  })).observe(document.getElementById("results"), { childList: true, subtree: true, characterData: true });
}"""


def test_page_draws_the_heat_map_row_by_row_as_the_stream_comes(tmp_path_factory, toy_dir, monkeypatch):
    """Each decoding step slowed (as tests/test_serve_hostile.py does): the page's live heat map gains rows one by one
    before the final panel replaces it; with the stream route failing, the page falls back to the plain call."""
    import time

    from nmt.serve import lanes

    real = lanes.Stoppable.step
    monkeypatch.setattr(lanes.Stoppable, "step", lambda self, *a, **k: time.sleep(0.04) or real(self, *a, **k))
    runs = trained_pair(tmp_path_factory, toy_dir)
    models = [load_model("a", runs["a"], DECODE, torch.device("cpu"))]
    sentence = " ".join((toy_dir / "test.src").read_text().splitlines()[:2])
    with serving(models, ServeSettings(access_log=False)) as (base, _), sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            page.goto(base + "/")
            page.wait_for_selector("#model option", state="attached")
            page.evaluate(WATCH)
            page.fill("#text", sentence)
            page.click("#go")
            page.wait_for_selector(".panel:not(.live) td.cell")
            page.wait_for_selector("#go:not([disabled])")
            before_final = [s["live"] for s in page.evaluate("window.seen") if s["done"] == 0]
            assert max(before_final) >= 3 and len(set(before_final)) >= 3, before_final  # rows came one by one
            with httpx_client(base) as client:
                expected = translate(client, {"text": [sentence]})["translations"][0]["text"]
            assert page.inner_text(".panel .translation") == expected
            assert page.locator("table.heat.live").count() == 0  # the final panel replaced the live one

            page.route("**/v1/translate/stream", lambda route: route.abort())
            page.evaluate("document.getElementById('results').replaceChildren()")
            page.click("#go")
            page.wait_for_selector(".panel td.cell")
            page.wait_for_selector("#go:not([disabled])")
            assert page.inner_text(".panel .translation") == expected and page.locator("#error").is_hidden()
        finally:
            browser.close()
