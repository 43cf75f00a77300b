"""A fake payment gateway, run as its own process by the demo and the tests.

It honours its own idempotency keys the way real gateways do: a charge
request with a key it has seen returns the first result again (a charge or a
decline) instead of charging twice. It counts what it really did.

    POST /charges   {"amount": 1000}  with Idempotency-Key  -> 201 {"id": "ch_1", ...} | 402
    POST /control   {"decline": bool, "delay": seconds, "fail": n, "hold": bool}
                    (fail: next n calls 503; hold: charges wait until it is false again)
    GET  /stats     {"charges": n, "calls": n, "keys": n, "held": n}   (held: waiting now)
    GET  /charges   [{"id": "ch_1", "key": "...", "amount": 1000}, ...]   every charge made
    POST /reset
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Condition()
STATE: dict = {}


def reset() -> None:
    STATE.clear()
    STATE.update(charges=0, calls=0, results={}, made=[], decline=False, delay=0.0, fail=0,
                 hold=False, held=0)
    LOCK.notify_all()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/charges":
            with LOCK:
                made = list(STATE["made"])
            data = json.dumps(made).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        with LOCK:
            self._send(
                200,
                {
                    "charges": STATE["charges"],
                    "calls": STATE["calls"],
                    "keys": len(STATE["results"]),
                    "held": STATE["held"],
                },
            )

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if self.path == "/reset":
            with LOCK:
                reset()
            return self._send(200, {})
        if self.path == "/control":
            with LOCK:
                STATE.update({k: v for k, v in body.items()
                              if k in ("decline", "delay", "fail", "hold")})
                LOCK.notify_all()
            return self._send(200, {})
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self._send(400, {"error": "idempotency key required"})
        with LOCK:
            STATE["calls"] += 1
            delay = STATE["delay"]
            if STATE["fail"]:
                STATE["fail"] -= 1
                return self._send(503, {"error": "unavailable"})
            STATE["held"] += 1
            LOCK.wait_for(lambda: not STATE["hold"], timeout=60)
            STATE["held"] -= 1
        time.sleep(delay)
        with LOCK:
            if key not in STATE["results"]:
                if STATE["decline"]:
                    STATE["results"][key] = (402, {"error": "card_declined"})
                else:
                    STATE["charges"] += 1
                    charge = {"id": f"ch_{STATE['charges']}", "amount": body.get("amount")}
                    STATE["results"][key] = (201, charge)
                    STATE["made"].append({**charge, "key": key})
            status, result = STATE["results"][key]
        self._send(status, result)


def main() -> None:
    with LOCK:
        reset()
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
