"""The README's first command, `make demo`, runs `ticketrec demo`: a synthetic knowledge base, a model trained on its
labelled queries, the index, then the UI served. Run here as a user runs it (a smaller knowledge base), in a fresh
home, the UI asked over HTTP on 127.0.0.1; run again, it reuses what the first run made."""
import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from conftest import free_port, stop_process

ROOT = Path(__file__).resolve().parents[1]
TICKETREC = Path(sys.executable).parent / "ticketrec"
SMALL = ["--tickets", "300", "--queries", "30"]


def _http(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, None if body is None else json.dumps(body),
                     {} if body is None else {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        conn.close()


def _serving(port: int) -> bool:
    try:
        return _http(port, "GET", "/api/v1/healthz")[0] == 200
    except OSError:
        return False


def test_the_demo_sets_everything_up_serves_the_ui_and_reuses_it_the_second_time(tmp_path):
    port = free_port()
    env = {**os.environ, "TICKETREC_HOME": str(tmp_path / "home"), "TICKETREC_BROKER_URL": ""}
    env.pop("TICKETREC_MODEL", None)
    log = tmp_path / "demo.log"
    with open(log, "w") as out:
        server = subprocess.Popen([str(TICKETREC), "demo", *SMALL, "--port", str(port)], cwd=ROOT, env=env,
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not _serving(port):
            assert server.poll() is None, f"ticketrec demo exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the demo serves nothing: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        status, page = _http(port, "GET", "/")
        assert status == 200 and "Find similar tickets" in page
        status, answer = _http(port, "POST", "/api/v1/recommendations",
                              {"subject": "GT trips on high exhaust temperature spread", "k": 3})
        results = json.loads(answer)["results"]
        assert status == 200 and len(results) == 3
        assert all(1 <= r["score"] <= 5 and r["ticket"]["solution"] for r in results)
    finally:
        stop_process(server)
    first = log.read_text()
    assert "1/3 knowledge base: generating 300 synthetic tickets and 30 labelled queries" in first
    assert "2/3 model: training" in first and "3/3 index" in first
    assert len(re.findall(r"^  \d\. \[\d\.\d/5\] ", first, re.M)) == 3, first[-3000:]  # the sample query's answer
    assert "Traceback" not in first
    # Written to a file, a progress bar is a heartbeat, not a line per batch (tqdm's redraws end in "\r" or "\n").
    redraws = re.findall(r"DocNADE epoch 1/\d+:", first)
    assert 1 <= len(redraws) <= 3, f"{len(redraws)} redraws of one DocNADE epoch's bar in the log"

    again = subprocess.run([str(TICKETREC), "demo", *SMALL, "--no-serve"], cwd=ROOT, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1/3 knowledge base: 300 tickets already in" in again.stdout
    assert "2/3 model: using" in again.stdout
    version = re.compile(r"index version (\S+)")
    assert version.findall(again.stdout) == version.findall(first)  # nothing changed: the same version serves
