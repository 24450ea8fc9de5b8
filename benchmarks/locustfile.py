"""Locust scenario of the JSON API: each user posts varied tickets to /api/v1/recommendations without pause and
now and then reads one of the tickets it was recommended (GET /api/v1/tickets/ID).

An answer counts as a failure unless it is a 200 whose `index_version` is a version that exists (or existed during
the run) under --index-dir and whose `model_version` is the model that index version carries ("mixed versions"
otherwise); a ticket read must be a 200 naming that ticket.

    .venv/bin/locust -f benchmarks/locustfile.py --headless -u 50 -r 50 -t 60s --host http://127.0.0.1:8000 \\
        --kb kb.jsonl --index-dir "$TICKETREC_HOME/indexes" --summary summary.json

--kb: the JSONL knowledge base the server imported (`ticketrec synth` output): its queries, its tickets' subject and
description, and the first sentence of either, each with k 5, 10 or 20, are the load. --summary: a JSON file written
at the end with the final request figures, the answers per index version and scoring mode, the version failures and
the first fallback reasons.
benchmarks/load_locust.py starts the server and runs this file for its scenarios (plain, reindex, Redis killed).
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from locust import FastHttpUser, constant, events, task

RECOMMEND = "/api/v1/recommendations"
#: Share of recommendations followed by a read of one recommended ticket.
READ_SHARE = 0.2

_texts: list[tuple[str, str]] = []
_versions: dict[str, str | None] = {}  # index version → the model version it carries (None: no such version)
_seen: dict[str, Counter] = {"index_version": Counter(), "mode": Counter(), "failure": Counter()}
_fallback_reasons: list[str] = []


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--kb", default="", help="JSONL knowledge base whose queries and tickets are posted")
    parser.add_argument("--index-dir", default="", help="TICKETREC_HOME/indexes: answers' versions are checked there")
    parser.add_argument("--summary", default="", help="JSON file written at the end (versions, modes, failures)")


@events.init.add_listener
def _load_texts(environment, **_kw) -> None:
    options = environment.parsed_options
    if options is None or not options.kb:
        raise SystemExit("give --kb: the JSONL knowledge base the server imported (its queries are the load)")
    with open(options.kb, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("subject") and rec.get("description"):
                _texts.append((rec["subject"], rec["description"]))
    if not _texts:
        raise SystemExit(f"no subject/description pairs in {options.kb}")


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]


def model_of(index_dir: str, version: str) -> str | None:
    """The model version index `version` carries (from its manifest, read once), or None when there is no such
    version (pruned versions stay known once seen)."""
    if version not in _versions or _versions[version] is None:
        try:
            manifest = json.loads((Path(index_dir) / version / "manifest.json").read_text(encoding="utf-8"))
            _versions[version] = str(manifest["model_version"])
        except (OSError, ValueError, KeyError):
            _versions[version] = None
    return _versions[version]


def version_problem(index_dir: str, answer: dict) -> str | None:
    """Why an answer's versions are wrong (unknown index version, or a model it does not carry), else None."""
    index_version, model_version = answer.get("index_version"), answer.get("model_version")
    if not isinstance(index_version, str) or not index_version:
        return "answer without an index version"
    if not index_dir:
        return None
    carried = model_of(index_dir, index_version)
    if carried is None:
        return "index version that never existed"
    if carried != model_version:
        return "mixed versions: a model the index version does not carry"
    return None


class TicketUser(FastHttpUser):
    """An engineer's client asking for similar tickets as fast as the answers come (a closed loop, no think time)."""

    wait_time = constant(0)

    def _query(self) -> dict:
        subject, description = random.choice(_texts)
        variant = random.random()
        if variant < 0.25:
            description = _first_sentence(description)
        elif variant < 0.35:
            subject = _first_sentence(random.choice(_texts)[1])[:200]
        return {"subject": subject, "description": description, "k": random.choice((5, 10, 10, 20))}

    @task
    def recommend(self) -> None:
        index_dir = self.environment.parsed_options.index_dir
        with self.client.post(RECOMMEND, json=self._query(), catch_response=True) as resp:
            if resp.status_code != 200:
                _seen["failure"][f"HTTP {resp.status_code}"] += 1
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
                return
            try:
                answer = resp.json()
            except ValueError:
                _seen["failure"]["not JSON"] += 1
                resp.failure("the answer is not JSON")
                return
            problem = version_problem(index_dir, answer)
            if problem:
                _seen["failure"][problem] += 1
                resp.failure(f"{problem}: {answer.get('index_version')} / {answer.get('model_version')}")
                return
            _seen["index_version"][answer["index_version"]] += 1
            served = answer.get("served") or {}
            _seen["mode"][str(served.get("mode"))] += 1
            reason = served.get("fallback_reason")
            if reason and len(_fallback_reasons) < 3 and reason not in _fallback_reasons:
                _fallback_reasons.append(reason)
            results = answer.get("results") or []
        if results and random.random() < READ_SHARE:
            ticket_id = random.choice(results)["ticket"]["id"]
            with self.client.get(f"/api/v1/tickets/{quote(ticket_id, safe='')}", name="/api/v1/tickets/[id]",
                                 catch_response=True) as resp:
                if resp.status_code != 200 or resp.json().get("id") != ticket_id:
                    _seen["failure"][f"ticket read HTTP {resp.status_code}"] += 1
                    resp.failure(f"HTTP {resp.status_code} reading ticket {ticket_id}")


def final_stats(environment) -> dict[str, dict]:
    """Requests, failures, requests/s and p50/p95/p99 (ms) per request name and "Aggregated", from the final stats
    (locust's --csv files are rewritten every 2 s, so they can miss the last seconds of a run)."""
    entries = {entry.name: entry for entry in environment.stats.entries.values()}
    entries["Aggregated"] = environment.stats.total
    return {name: {"requests": e.num_requests, "failures": e.num_failures, "rps": e.total_rps,
                   **{f"p{q}": e.get_response_time_percentile(q / 100) for q in (50, 95, 99)}}
            for name, e in entries.items()}


@events.quitting.add_listener
def _write_summary(environment, **_kw) -> None:
    path = environment.parsed_options.summary if environment.parsed_options else ""
    if path:  # quitting fires once the users have stopped: these are the run's final figures
        Path(path).write_text(json.dumps({
            "stats": final_stats(environment),
            "index_versions": dict(_seen["index_version"]), "modes": dict(_seen["mode"]),
            "failures": dict(_seen["failure"]), "fallback_reasons": _fallback_reasons,
            "versions_known": {k: v for k, v in _versions.items() if v is not None},
        }, indent=1))
