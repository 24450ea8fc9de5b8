"""Real headless Chromium (Selenium) against the app served on 127.0.0.1: search, results, feedback, form errors,
a filter menu."""
import re
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def live_url(web_engine):
    """The app (CSRF on, real engine) served by a werkzeug server on a free port in a thread; stopped afterwards."""
    from werkzeug.serving import make_server

    from web import create_app

    settings, engine = web_engine
    app = create_app({"TICKETREC_SETTINGS": settings, "TICKETREC_ENGINE": engine})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="web-under-test", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def browser(tmp_path):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"Chromium or ChromeDriver not installed ({CHROMIUM}, {CHROMEDRIVER}); "
                    "`make system-deps` (apt-get install chromium chromium-driver) installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_search_results_feedback_and_form_errors(browser, live_url, web_engine, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from recommender.data.store import Store, query_key

    settings, engine = web_engine
    wait = WebDriverWait(browser, 30)
    shots = tmp_path / "screenshots"
    shots.mkdir()

    # an empty form gets its errors on the page, and no results
    browser.get(live_url + "/")
    browser.find_element(By.ID, "search-button").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".field-error")))
    errors = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".field-error")]
    assert any("subject" in e for e in errors) and not any("description" in e for e in errors)  # it is optional
    assert not browser.find_elements(By.CSS_SELECTOR, "article.card")
    browser.save_screenshot(str(shots / "empty-form.png"))

    # a query gives 10 result cards, each with a solution and a 1-5 score
    subject, description = "turbine rotor vibration", "High vibration on the blade and bearing after restart."
    browser.find_element(By.ID, "subject").send_keys(subject)
    browser.find_element(By.ID, "description").send_keys(description)
    browser.find_element(By.ID, "search-button").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.card")) == 10)
    cards = browser.find_elements(By.CSS_SELECTOR, "article.card")
    for card in cards:
        assert card.find_element(By.CSS_SELECTOR, ".solution-text").text.strip()
        assert re.fullmatch(r"[1-5]\.\d", card.find_element(By.CSS_SELECTOR, ".score-value").text)
        if engine.index.metric_spec["channels"].get("T", 0) > 0:  # topic chips only when the topic channel weighs
            assert card.find_element(By.CSS_SELECTOR, ".chip").get_attribute("title").startswith("topic ")
        else:
            assert not card.find_elements(By.CSS_SELECTOR, ".chip")
        assert "typical candidate" in card.find_element(By.CSS_SELECTOR, ".why").get_attribute("title")
    assert browser.find_elements(By.CSS_SELECTOR, "article.card mark")  # shared words highlighted
    assert engine.index.version in browser.find_element(By.CSS_SELECTOR, "footer").text
    browser.save_screenshot(str(shots / "results.png"))

    # YES on the second result is stored (through the page's JavaScript and the JSON API)
    card = cards[1]
    ticket_id = card.get_attribute("data-ticket-id")
    yes = card.find_element(By.CSS_SELECTOR, "button.fb-yes")
    yes.click()
    wait.until(lambda d: "given" in yes.get_attribute("class"))
    assert "Feedback given: YES" in card.find_element(By.CSS_SELECTOR, ".feedback-state").text
    with Store(settings.db) as store:
        stored = [(f.ticket_id, f.label, f.model_version) for f in store.feedback(query_key(subject, description))]
    assert stored == [(ticket_id, "YES", engine.model.version)]
    browser.save_screenshot(str(shots / "after-feedback.png"))

    # the same query again shows the feedback already given
    browser.find_element(By.ID, "search-button").click()
    wait.until(ec.staleness_of(card))
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.card")) == 10)
    again = browser.find_element(By.CSS_SELECTOR, f'article.card[data-ticket-id="{ticket_id}"]')
    assert "given" in again.find_element(By.CSS_SELECTOR, "button.fb-yes").get_attribute("class")

    for name in ("empty-form.png", "results.png", "after-feedback.png"):
        assert (shots / name).stat().st_size > 10_000
    print(f"screenshots in {shots}")


def test_a_filter_menu_narrows_the_results_and_keeps_its_choice(browser, live_url):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser.get(live_url + "/")
    Select(browser.find_element(By.ID, "filter-area")).select_by_value("valve")
    browser.find_element(By.ID, "subject").send_keys("turbine rotor vibration")
    browser.find_element(By.ID, "search-button").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "article.card"))
    shown = [card.get_attribute("data-ticket-id") for card in browser.find_elements(By.CSS_SELECTOR, "article.card")]
    valve = {f"WEB-{i}" for i in range(1, 23, 4)} | {"WEB-HTML"}  # the tickets whose area is valve
    assert sorted(shown) == sorted(valve)  # ten asked, seven pass: every one of them, none of the turbine tickets
    assert Select(browser.find_element(By.ID, "filter-area")).first_selected_option.get_attribute("value") == "valve"
    assert "Only tickets with area valve" in browser.find_element(By.CSS_SELECTOR, ".filtered").text
