"""Regenerate docs/screenshot-results.png: synthetic KB (600 tickets) -> small real model -> index -> the UI in headless
Chromium, one query, YES on the first result, the second one expanded. Takes about 90 s on one core.

    .venv/bin/python docs/make_screenshot.py docs/screenshot-results.png
"""
import sys
import tempfile
import threading
import time
from pathlib import Path
import torch

torch.set_num_threads(1)
from werkzeug.serving import make_server
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from recommender.config import Settings
from recommender.data.store import Store
from recommender.data.synthetic import generate
from recommender.model.siamese import SiameseConfig
from recommender.model.training import train_model
from recommender.serving.index import build_index
from recommender.serving.engine import Recommender
from web import create_app

home = Path(tempfile.mkdtemp())
s = Settings.from_env({"TICKETREC_HOME": str(home)})
data = generate(600, 120, seed=3)
with Store(s.db) as st:
    st.import_dataset(data)
    cfg = SiameseConfig(hidden=50, word_dim=100, topics=20, topic_epochs=5, epochs=3, w2v_epochs=5)
    model = train_model(data, None, cfg, s.model, progress=False)
    build_index(st, model, s, progress=False)
engine = Recommender(s)
q = data.queries[7]
print("query:", q.subject, "|", q.description[:200])
app = create_app({"TICKETREC_SETTINGS": s, "TICKETREC_ENGINE": engine})
srv = make_server("127.0.0.1", 0, app, threaded=True); threading.Thread(target=srv.serve_forever, daemon=True).start()
o = webdriver.ChromeOptions()
for a in "--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --window-size=1400,1050 --hide-scrollbars".split(): o.add_argument(a)
o.add_argument("--user-data-dir=" + tempfile.mkdtemp())
d = webdriver.Chrome(options=o, service=Service("/usr/bin/chromedriver"))
d.get(f"http://127.0.0.1:{srv.server_port}/")
d.find_element(By.ID, "subject").send_keys(q.subject)
d.find_element(By.ID, "description").send_keys(q.description)
d.find_element(By.ID, "search-button").click()
WebDriverWait(d, 60).until(lambda x: len(x.find_elements(By.CSS_SELECTOR, "article.card")) == 10)
cards = d.find_elements(By.CSS_SELECTOR, "article.card")
cards[0].find_element(By.CSS_SELECTOR, "button.fb-yes").click()
WebDriverWait(d, 30).until(lambda x: "given" in cards[0].find_element(By.CSS_SELECTOR, "button.fb-yes").get_attribute("class"))
cards[1].find_element(By.CSS_SELECTOR, "details summary").click()
time.sleep(0.5)
d.save_screenshot(sys.argv[1]); d.quit(); srv.shutdown()
