"""The shop's OpenAPI schema answers its first concurrent requests (a threaded worker's)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.example.shop import shop_environment
from tests.live import ROOT

# A fresh process, as a web worker just started: N threads ask for the schema at once.
FIRST_REQUESTS = """
import json, sys, threading
import django
django.setup()
from django.test import Client

count = int(sys.argv[1])
start = threading.Barrier(count)
statuses = []

def ask():
    client = Client()
    start.wait()
    try:
        statuses.append(client.get("/schema/", HTTP_HOST="127.0.0.1").status_code)
    except Exception as exc:  # the test client re-raises the view's exception
        statuses.append(repr(exc))

threads = [threading.Thread(target=ask) for _ in range(count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(statuses))
"""


def test_concurrent_first_schema_requests_all_answer_200():
    environment = shop_environment("shop_schema_test", "http://127.0.0.1:9")  # no database used
    for _ in range(3):  # three fresh processes: each one's first generation is the race
        done = subprocess.run([sys.executable, "-c", FIRST_REQUESTS, "16"], cwd=ROOT,
                              env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [200] * 16, done.stdout[-2000:]
