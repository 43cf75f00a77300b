"""Failover: a relay or consumer that dies is replaced within about a second; a
slow one is never displaced; a clean stop hands over at once.

Real processes (``manage.py relay_outbox`` / ``run_consumers``) against the
test database and Redis. The takeovers are held to what the docs promise
(about a second for a relay, at once for a consumer's partition); each test
prints what it measured (``pytest -s``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.outbox.support.helpers import (
    PATIENCE,
    SUBPROCESS_SETTINGS,
    Process,
    drain,
    effects,
    faulty_transport,
    message_position,
    offset,
    publish_many,
    queue_length,
    queued_message_ids,
    wait_for,
)
from tests.outbox.support.recorders import SlowRecorder

A = 1
#: The relays' lease here: the library's default (docs/settings.md, RELAY_LEASE), and the
#: loops' poll (POLL_INTERVAL).
LEASE, POLL = 1.0, 0.05


def lease_owner_pid(name: str = "relay:default") -> int | None:
    from tests.helpers import observer

    with observer() as conn:
        row = conn.execute("SELECT lease_owner FROM consumer_offsets WHERE name = %s"
                           " AND lease_until > now()", [name]).fetchone()
    return int(row[0].split(":")[1]) if row and row[0] else None


def idle_since(application_name: str):
    """When the session of ``application_name`` last went idle (None: not idle, or none)."""
    from tests.helpers import observer

    with observer() as conn:
        row = conn.execute(
            "SELECT max(state_change) FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database() AND state = 'idle'", [application_name],
        ).fetchone()
    return row[0]


def wait_for_value(get, what: str):
    """``get()``'s first value that is not None."""
    found = []
    wait_for(lambda: found.append(get()) or found[-1] is not None, what)
    return found[-1]


def relayed(message_id) -> bool:
    """Whether the relay's offset has passed ``message_id``."""
    row = offset("relay:default")
    return row is not None and row[0] >= message_position(message_id)


def relay(tmp_path, label: str, queue: str, *args: str, **env: str) -> Process:  # noqa: F811
    proc = Process.manage("relay_outbox", *args, log=tmp_path / f"{label}.log",
                          env={**SUBPROCESS_SETTINGS, "DIO_CELERY_QUEUE": queue, **env})
    proc.wait_output("running")
    return proc


def test_a_relay_killed_by_sigkill_is_replaced_by_a_waiting_one_about_a_second_later(
    tmp_path, queue  # noqa: F811
):
    first = relay(tmp_path, "first", queue)
    second = None
    try:
        ids = publish_many(A, "order.placed", [{"sku": f"a{i}"} for i in range(5)])
        wait_for(lambda: relayed(ids[-1]), "relayed")
        second = relay(tmp_path, "second", queue)
        assert lease_owner_pid() == first.popen.pid
        first.signal(signal.SIGKILL)
        killed = time.monotonic()
        assert first.popen.wait(60) == -signal.SIGKILL
        while lease_owner_pid() != second.popen.pid:
            assert time.monotonic() - killed < PATIENCE, "the waiting relay never took over"
            time.sleep(0.01)
        took = time.monotonic() - killed
        ids += publish_many(A, "order.placed", [{"sku": f"b{i}"} for i in range(5)])
        wait_for(lambda: queue_length(queue) == 10, "the new holder to send")
        assert second.stop() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    print(f"\nrelay replaced {took:.2f} s after SIGKILL (lease {LEASE:g} s)")
    # About a second (docs/outbox.md): when the lease, last renewed at most a quarter of it
    # before the kill, runs out, plus the waiting relay's poll (POLL_INTERVAL, 0.05 s).
    assert LEASE / 2 <= took <= LEASE + 0.5, took
    assert queued_message_ids(queue) == {str(i): 1 for i in ids}


def test_a_relay_whose_broker_call_outlasts_its_lease_keeps_it(tmp_path, queue):  # noqa: F811
    """Each batch takes three leases to send; the waiting relay never takes over."""
    slow = relay(tmp_path, "slow", queue, "--transport", faulty_transport("SlowSend"),
                 "--batch-size", "2", DIO_SEND_DELAY="3")
    waiting = None
    owners: set[int | None] = set()
    try:
        wait_for(lambda: lease_owner_pid() == slow.popen.pid, "the slow relay's lease")
        waiting = relay(tmp_path, "waiting", queue)
        ids = publish_many(A, "order.placed", [{"sku": f"s{i}"} for i in range(4)])
        started = time.monotonic()
        while not relayed(ids[-1]):
            owners.add(lease_owner_pid())
            assert time.monotonic() - started < 60, "the slow relay did not finish"
            time.sleep(0.05)
        took = time.monotonic() - started
        assert slow.stop() == 0 and waiting.stop() == 0
    finally:
        slow.kill()
        if waiting is not None:
            waiting.kill()
    print(f"\nslow relay: 2 batches of 3 s each in {took:.1f} s, lease holders seen: {owners}")
    assert owners == {slow.popen.pid}
    assert queued_message_ids(queue) == {str(i): 1 for i in ids}  # no batch sent twice
    assert "4 message(s) sent" in slow.output
    assert "0 message(s) sent" in waiting.output
    assert "lost" not in slow.output


def test_a_relay_stopped_with_sigterm_hands_over_at_once(tmp_path, queue):  # noqa: F811
    lease = {"DIO_RELAY_LEASE": "30"}  # a takeover by expiry would take 30 s
    first = relay(tmp_path, "first", queue, **lease)
    second = None
    try:
        ids = publish_many(A, "order.placed", [{"sku": "a"}])
        wait_for(lambda: relayed(ids[-1]), "relayed")
        second = relay(tmp_path, "second", queue, **lease)
        assert first.stop() == 0
        stopped = time.monotonic()
        wait_for(lambda: lease_owner_pid() == second.popen.pid, "the second relay's lease")
        took = time.monotonic() - stopped
        ids += publish_many(A, "order.placed", [{"sku": "b"}])
        wait_for(lambda: queue_length(queue) == 2, "the second relay to send")
        assert second.stop() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    print(f"\nrelay handed over {took:.2f} s after SIGTERM (lease 30 s)")
    assert took < POLL + 1.0
    assert queued_message_ids(queue) == {str(i): 1 for i in ids}


def test_a_consumer_killed_mid_batch_is_replaced_by_a_running_one_at_once(tmp_path):
    marker = tmp_path / "hanging"
    ids = publish_many(A, "order.slow", [{"sku": f"s{i}"} for i in range(12)])
    hanging = Process.manage(
        "run_consumers", "orders-slow", log=tmp_path / "hanging.log",
        env={**SUBPROCESS_SETTINGS, "DIO_HANG_ON": "s5", "DIO_HANG_MARKER": str(marker)},
    )
    other = None
    try:
        wait_for(marker.exists, "the first consumer to hang inside its batch")
        other = Process.manage("run_consumers", "orders-slow", log=tmp_path / "other.log",
                               env={**SUBPROCESS_SETTINGS, "PGAPPNAME": "dio-other-consumer"})
        other.wait_output("running")
        # The running consumer polls: a transaction of its session ends, then another. Each
        # met the partition locked by the hanging batch (or it would have handled messages).
        first_poll = wait_for_value(lambda: idle_since("dio-other-consumer"), "its first poll")
        wait_for(lambda: (idle_since("dio-other-consumer") or first_poll) > first_poll,
                 "another poll")
        assert effects() == {}  # the partition is locked by the hanging batch
        hanging.signal(signal.SIGKILL)
        killed = time.monotonic()
        while len(effects()) != 12:
            assert time.monotonic() - killed < PATIENCE, "the partition was never taken"
            time.sleep(0.01)
        took = time.monotonic() - killed
        wait_for(lambda: len(effects()) == 12, "the running consumer to handle the rest")
        assert other.stop() == 0
    finally:
        hanging.kill()
        if other is not None:
            other.kill()
    print(f"\nconsumer partition taken over {took:.2f} s after SIGKILL")
    # At once (docs/consumers.md): the server ends the dead client's session as its socket
    # closes, releasing the partition; the running consumer's next poll (0.05 s) takes it
    # and handles the 12 messages.
    assert took < 1.0, took
    assert effects() == {str(i): 1 for i in ids}
    assert SlowRecorder.name == "orders-slow"


WATCHED = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
           "tcp_user_timeout", "client_connection_check_interval")


class SessionRecorder(SlowRecorder):
    """Records, from inside its batch, how the server watches the batch's connection."""

    name = "session-recorder"
    topics = None
    seen: dict[str, str] = {}

    def handle(self, message) -> None:
        from django.db import connections

        from tenancy.aliases import tenant_alias

        with connections[tenant_alias()].cursor() as cursor:  # the batch's: the worker alias
            for setting in WATCHED:
                cursor.execute(f"SHOW {setting}")
                SessionRecorder.seen[setting] = cursor.fetchone()[0]


def watched_now() -> dict[str, str]:
    """The settings on the connection tenant work runs on now (a batch's: the worker alias)."""
    from django.db import connections

    from tenancy.aliases import tenant_alias

    with connections[tenant_alias()].cursor() as cursor:
        values = {}
        for setting in WATCHED:
            cursor.execute(f"SHOW {setting}")
            values[setting] = cursor.fetchone()[0]
    return values


def test_a_consumer_batch_has_the_server_watch_for_a_vanished_client(monkeypatch):
    """TCP keepalives (read back from the socket by SHOW) for the batch only.

    A host that vanishes without closing its connections (a power cut, a lost
    network) cannot be simulated here; what PostgreSQL does with these
    settings is its own documented behaviour.
    """
    from outbox.consumers import ensure_offsets, run_batch

    publish_many(A, "anything", [{"sku": "x"}])
    consumer = SessionRecorder()
    ensure_offsets(consumer)
    outside = watched_now()
    wait_for(lambda: run_batch(consumer).handled == 1, "the batch")
    assert SessionRecorder.seen == {
        "tcp_keepalives_idle": "1", "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "2", "tcp_user_timeout": "3000",  # ms
        "client_connection_check_interval": "1s",
    }
    assert watched_now() == outside  # restored when the batch ends
    assert outside["tcp_keepalives_idle"] != "1"
    monkeypatch.setattr(SessionRecorder, "lost_after", 10)
    SessionRecorder.seen = {}
    publish_many(A, "anything", [{"sku": "y"}])
    wait_for(lambda: run_batch(consumer).handled == 1, "the second batch")
    assert SessionRecorder.seen["tcp_keepalives_count"] == "9"
    assert SessionRecorder.seen["tcp_user_timeout"] == "10000"
    monkeypatch.setattr(SessionRecorder, "lost_after", 0)
    publish_many(A, "anything", [{"sku": "z"}])
    wait_for(lambda: run_batch(consumer).handled == 1, "the third batch")
    assert SessionRecorder.seen == {**outside}  # 0: the server's own settings


class VanishingHost:
    """A host of its own for a consumer process: a network namespace, reaching the test
    cluster (127.0.0.1) through a veth pair. :meth:`vanish` takes its link down: from then
    on its packets are dropped, and nothing is closed, as when a host loses power or its
    network. Needs root (``ip netns``) and the cluster's pg_hba.conf (a line for its
    address, removed after)."""

    def __init__(self) -> None:
        import random

        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        self.namespace, self.host_link, self.link = f"dio-vanish-{tag}", f"dvh{tag}", f"dvn{tag}"
        net = f"10.213.{random.randrange(256)}.{4 * random.randrange(64)}"
        base = net.rsplit(".", 1)
        self.host_address = f"{base[0]}.{int(base[1]) + 1}"
        self.address = f"{base[0]}.{int(base[1]) + 2}"
        self._hba: tuple[Path, str] | None = None

    def _ip(self, *args: str, inside: bool = False) -> None:
        command = ["ip", "netns", "exec", self.namespace, "ip", *args] if inside else ["ip", *args]
        subprocess.run(command, check=True, capture_output=True, timeout=30)

    def __enter__(self) -> VanishingHost:
        self._ip("netns", "add", self.namespace)
        self._ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.link)
        self._ip("link", "set", self.link, "netns", self.namespace)
        self._ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
        self._ip("link", "set", self.host_link, "up")
        self._ip("addr", "add", f"{self.address}/30", "dev", self.link, inside=True)
        self._ip("link", "set", self.link, "up", inside=True)
        # 127.0.0.1 (where the cluster listens) is reached over the veth pair: routing to and
        # from loopback addresses is allowed on these two links only.
        Path(f"/proc/sys/net/ipv4/conf/{self.host_link}/route_localnet").write_text("1")
        subprocess.run(["ip", "netns", "exec", self.namespace, "sh", "-c",
                        f"echo 1 > /proc/sys/net/ipv4/conf/{self.link}/route_localnet"],
                       check=True, timeout=30)
        self._ip("route", "add", "127.0.0.1/32", "via", self.host_address, "dev", self.link,
                 "src", self.address, inside=True)
        from tests.helpers import observer

        with observer() as conn:
            hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
            self._hba = (hba, hba.read_text())
            hba.write_text(self._hba[1] + f"\nhost all all {self.address}/32 scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        return self

    def command(self, *args: str) -> list[str]:
        """``args``, run on this host."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def vanish(self) -> None:
        self._ip("link", "set", self.link, "down", inside=True)

    def __exit__(self, *exc: object) -> None:
        from tests.helpers import observer

        with observer() as conn:
            if self._hba is not None:
                self._hba[0].write_text(self._hba[1])
                conn.execute("SELECT pg_reload_conf()")
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE client_addr = %s::inet", [self.address])
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, timeout=30)


def _can_make_hosts() -> str:
    """Why a vanishing host cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "no ip command (iproute2)"
    return ""


@pytest.mark.skipif(bool(_can_make_hosts()), reason=_can_make_hosts() or "-")
@pytest.mark.direct_sessions("worker", reason="the server watches its TCP peer, which behind "
                             "pgbouncer is pgbouncer (docs/consumers.md)")
def test_a_consumer_whose_host_vanishes_mid_batch_is_cut_off_after_about_lost_after(tmp_path):
    """docs/consumers.md: PostgreSQL ends the session of a consumer whose host vanished
    mid-batch after about ``lost_after`` (3 s), rolling the batch back and releasing the
    partition, which another consumer then takes."""
    marker = tmp_path / "hanging"
    ids = publish_many(A, "order.slow", [{"sku": f"s{i}"} for i in range(12)])
    with VanishingHost() as host:
        hanging = Process(
            host.command(sys.executable, "manage.py", "run_consumers", "orders-slow"),
            tmp_path / "hanging.log",
            env={**SUBPROCESS_SETTINGS, "DIO_HANG_ON": "s5", "DIO_HANG_MARKER": str(marker)},
        )
        try:
            wait_for(marker.exists, "the consumer on the other host to hang inside its batch")
            from tests.helpers import observer

            with observer() as conn:
                [(batch,)] = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE client_addr = %s::inet"
                    " AND state = 'idle in transaction'", [host.address]).fetchall()

            def alive() -> bool:
                with observer() as conn:
                    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                        [batch]).fetchone() == (1,)

            host.vanish()
            vanished = time.monotonic()
            while alive():
                assert time.monotonic() - vanished < 15, "the session was never ended"
                time.sleep(0.05)
            took = time.monotonic() - vanished
            drain(SlowRecorder(), until=lambda: len(effects()) == 12)  # the partition is free
        finally:
            hanging.kill()
    print(f"\nthe vanished consumer's session ended {took:.2f} s after its host vanished"
          f" (lost_after {SlowRecorder.lost_after:g} s)")
    assert took <= SlowRecorder.lost_after + 1.0, took
    assert effects() == {str(i): 1 for i in ids}  # its batch rolled back, handled once after
