"""The load generator: clients that order, pay, and retry the way clients should.

Each intent is one customer's purchase: create an order, then capture its
payment. Each of the two requests gets a fresh Idempotency-Key, and every
retry of it sends the same key and the same body, until a final answer:

- 201: done (a replay, after a lost answer, is as good as the first);
- 409 with Retry-After (the first attempt still runs), 5xx, no answer at all
  (connection refused or closed, a timeout): wait and retry, with the same key;
- any other answer: final, and counted as refused (the checker fails the run
  on any: the soak's requests are all valid).

The customer's e-mail names the intent (``i<n>@soak.test``), so the checker
can find the intent's order in the database.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import requests

REQUEST_TIMEOUT = 20.0
LONGEST_PAUSE = 2.0


@dataclass
class Intent:
    number: int
    user: str
    sku: str
    quantity: int
    order_key: str = field(default_factory=lambda: str(uuid.uuid4()))
    capture_key: str = field(default_factory=lambda: str(uuid.uuid4()))
    order_id: int | None = None
    charge: str | None = None
    refused: str = ""  # the final answer that was not a 201, if any
    attempts: int = 0

    @property
    def email(self) -> str:
        return f"i{self.number}@soak.test"

    @property
    def done(self) -> bool:
        return bool(self.refused) or self.charge is not None


class Load:
    """Threads that create intents until stopped, and finish what they started."""

    def __init__(self, base_url: str, users: dict[str, dict], *, threads: int, seed: int) -> None:
        self.base_url = base_url
        self.users = users  # username -> {"token": ..., "skus": [...]}
        self.threads = threads
        self.seed = seed
        self.intents: list[Intent] = []
        self.answers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop_new = threading.Event()
        self._give_up = threading.Event()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self.threads):
            thread = threading.Thread(
                target=self._run, args=(random.Random(self.seed * 1000 + index),),
                name=f"client-{index}", daemon=True,
            )
            thread.start()
            self._workers.append(thread)

    def stop_new_intents(self) -> None:
        self._stop_new.set()

    def finish(self, timeout: float) -> bool:
        """Wait for the intents in flight; True when every one got its final answer."""
        deadline = time.monotonic() + timeout
        for thread in self._workers:
            thread.join(max(deadline - time.monotonic(), 0))
        self._give_up.set()
        for thread in self._workers:
            thread.join(REQUEST_TIMEOUT + 5)
        return all(intent.done for intent in self.intents)

    def _new_intent(self, rng: random.Random) -> Intent:
        user = rng.choice(sorted(self.users))
        with self._lock:
            intent = Intent(len(self.intents) + 1, user, rng.choice(self.users[user]["skus"]),
                            rng.randint(1, 3))
            self.intents.append(intent)
        return intent

    def _run(self, rng: random.Random) -> None:
        while not self._stop_new.is_set():
            intent = self._new_intent(rng)
            self._purchase(intent, rng)

    def _purchase(self, intent: Intent, rng: random.Random) -> None:
        answer = self._until_final(
            intent, rng, "/orders/", intent.order_key,
            {"product": intent.sku, "quantity": intent.quantity, "email": intent.email},
        )
        if answer is None:
            return
        intent.order_id = int(answer["id"])
        answer = self._until_final(
            intent, rng, f"/orders/{intent.order_id}/capture/", intent.capture_key, None
        )
        if answer is not None:
            intent.charge = str(answer["charge"])

    def _until_final(
        self, intent: Intent, rng: random.Random, path: str, key: str, body: dict | None
    ) -> dict | None:
        headers = {
            "Authorization": f"Token {self.users[intent.user]['token']}",
            "Idempotency-Key": key,
        }
        pause = 0.1
        while not self._give_up.is_set():
            intent.attempts += 1
            try:
                response = requests.post(self.base_url + path, json=body, headers=headers,
                                         timeout=REQUEST_TIMEOUT)
            except requests.RequestException:
                self.answers["no answer"] += 1
            else:
                status = response.status_code
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                self.answers[f"{status}{' replayed' if replayed else ''}"] += 1
                if status == 201:
                    return response.json()
                retry_after = response.headers.get("Retry-After")
                if status < 500 and not (status == 409 and retry_after):
                    intent.refused = f"{status} {response.text[:200]}"
                    return None
                if retry_after and retry_after.isdigit():
                    pause = max(pause, min(float(retry_after), LONGEST_PAUSE))
            time.sleep(pause * (0.5 + rng.random()))
            pause = min(pause * 2, LONGEST_PAUSE)
        return None
