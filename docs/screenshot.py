"""Regenerate docs/screenshot-results.png, README's picture of the results page: the demo's knowledge base and model,
one query, YES given on the first result and the second result's ticket opened.

    TICKETREC_HOME=H .venv/bin/ticketrec demo --no-serve
    TICKETREC_HOME=H .venv/bin/python docs/screenshot.py [--out docs/screenshot-results.png]

Needs Chromium and ChromeDriver (`make system-deps`). The app is served on 127.0.0.1 (a free port) only while the
picture is taken. The feedback it gives is stored in H's database, so use a home made for the picture.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
from pathlib import Path

SUBJECT = "erratic reading at DLN"
DESCRIPTION = ("Site XXXX here. UV scanner values jumping around, sometimes ## sometimes zero cable looks chewed near "
               "the JB. megger shows low value this is on the combustion system of unit ##. other units are fine. Bad "
               "signal from flame scanner, value flickering on the HMI. weather was cold. any idea what causes this?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).with_name("screenshot-results.png")))
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(chromium).exists() and Path(driver_path).exists()):
        sys.exit(f"Chromium or ChromeDriver not found ({chromium}, {driver_path}); `make system-deps` installs them")

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from werkzeug.serving import make_server

    from web import create_app

    server = make_server("127.0.0.1", 0, create_app(), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="screenshot", daemon=True)
    thread.start()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    with tempfile.TemporaryDirectory() as profile:
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--no-first-run", f"--window-size={args.width},{args.height}", f"--user-data-dir={profile}"):
            options.add_argument(arg)
        browser = webdriver.Chrome(options=options, service=Service(driver_path))
        try:
            wait = WebDriverWait(browser, 60)
            browser.get(f"http://127.0.0.1:{server.server_port}/")
            browser.find_element(By.ID, "subject").send_keys(SUBJECT)
            browser.find_element(By.ID, "description").send_keys(DESCRIPTION)
            browser.find_element(By.ID, "search-button").click()
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.card")) == 10)
            cards = browser.find_elements(By.CSS_SELECTOR, "article.card")
            yes = cards[0].find_element(By.CSS_SELECTOR, "button.fb-yes")
            yes.click()
            wait.until(lambda d: "given" in yes.get_attribute("class"))
            cards[1].find_element(By.CSS_SELECTOR, "details summary").click()
            browser.save_screenshot(args.out)
            scores = [c.find_element(By.CSS_SELECTOR, ".score-value").text for c in cards]
        finally:
            browser.quit()
            server.shutdown()
            server.server_close()
    print(f"{args.out}: the results of {SUBJECT!r}, scores {' '.join(scores)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
