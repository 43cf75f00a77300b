"""Draw ``make bench-scale``'s curves and write their tables into docs/benchmarks.md.

    .venv/bin/python bench/scale_report.py [bench/results/scale.json]

Reads the figures ``bench/bench_scale.py`` wrote; draws each curve as a PNG
into docs/img/scale/ (matplotlib, the ``bench`` dependency group) and
replaces the part of docs/benchmarks.md between the two ``bench-scale``
markers with a table beside each picture. Run by ``make bench-scale`` at the
end of every run; run it alone to redraw from the JSON.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "img" / "scale"
PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench-scale: begin (written by bench/scale_report.py; do not edit by hand) -->"
END = "<!-- bench-scale: end -->"


def mb(value: float) -> str:
    return f"{value / 2**20:,.1f} MB"


def n(value: float) -> str:
    return f"{value:,.0f}"


def ms(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:,.1f}"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def figure(name: str, alt: str) -> str:
    return f"![{alt}](img/scale/{name}.png)"


def run_line(run: dict[str, Any]) -> str:
    kind = "quick sizes (`--quick`)" if run.get("quick") else "full sizes"
    return (f"*{kind}; {run.get('date', '?')}, commit {run.get('commit', '?')}, "
            f"{run.get('cores', '?')} cores, PostgreSQL {run.get('postgresql', '?')} "
            f"(shared_buffers {run.get('shared_buffers', '?')}), load average "
            f"{run.get('load_start', '?')} at the start.*")


class Report:
    def __init__(self, data: dict[str, Any]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.phases = data.get("phases", {})
        self.parts: list[str] = []

    def save(self, fig: Any, name: str) -> None:
        IMAGES.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(IMAGES / f"{name}.png", dpi=90)
        self.plt.close(fig)

    def keys(self, p: dict[str, Any]) -> None:
        points = p["points"]
        rows = [q["rows"] for q in points]
        fig, (left, right, cpu) = self.plt.subplots(1, 3, figsize=(14, 3.6))
        for kind, label in (("new", "new key"), ("replay", "replay")):
            rates = [q[kind]["rate"] for q in points]
            cpu.plot(rows, [q[kind]["web_ms"] + q[kind]["db_ms"] for q in points], marker="o",
                     label=f"{label}: worker + PostgreSQL")
            cpu.plot(rows, [q[kind]["db_ms"] for q in points], marker=".", linestyle="--",
                     label=f"{label}: PostgreSQL")
            (line,) = left.plot(rows, rates, marker="o", label=label)
            left.axhline(rates[0] * 0.85, color=line.get_color(), linestyle=":", linewidth=1)
            right.plot(rows, [q[kind]["p99"] for q in points], marker="o", label=f"{label} p99",
                       color=line.get_color())
            right.plot(rows, [q[kind]["p50"] for q in points], marker=".", linestyle="--",
                       label=f"{label} p50", color=line.get_color())
        left.set(xscale="log", xlabel="rows in idempotency_keys", ylabel="requests/s",
                 title="throughput (dotted: -15 % of the smallest)", ylim=(0, None))
        right.set(xscale="log", xlabel="rows in idempotency_keys", ylabel="ms",
                  title="latency under saturation", ylim=(0, None))
        cpu.set(xscale="log", xlabel="rows in idempotency_keys", ylabel="CPU ms per request",
                title="CPU per request (steadier on a busy machine)", ylim=(0, None))
        left.legend()
        right.legend(fontsize="small")
        cpu.legend(fontsize="small")
        self.save(fig, "keys")
        body = table(
            ["rows", "tenants", "new key /s", "p50 / p99 ms", "replay /s", "p50 / p99 ms",
             "CPU ms per request (new, replay)", "heap", "indexes", "lookup buffers"],
            [[n(q["rows"]), n(q["tenants"]), n(q["new"]["rate"]),
              f"{ms(q['new']['p50'])} / {ms(q['new']['p99'])}", n(q["replay"]["rate"]),
              f"{ms(q['replay']['p50'])} / {ms(q['replay']['p99'])}",
              f"{q['new']['web_ms'] + q['new']['db_ms']:.2f}, "
              f"{q['replay']['web_ms'] + q['replay']['db_ms']:.2f}",
              mb(q["sizes"]["heap"]), mb(sum(q["sizes"]["indexes"].values())),
              str(q["lookup"]["buffers"])] for q in points])
        ratio = p["ratio_last_first"]
        self.section(
            "Keys: new key and replay as the table grows", p["run"],
            figure("keys", "requests/s and latency against rows in idempotency_keys"), body,
            f"gunicorn {p['workers']} sync workers, wrk {p['connections']} connections, "
            f"{p['rounds']} round(s) of {p['seconds']} s per workload and size (medians). "
            f"Largest against smallest: new key ×{ratio['new']:.2f}, replay "
            f"×{ratio['replay']:.2f} by requests/s; by CPU per request ×"
            f"{p['cpu_ratio']['new']:.2f} and ×{p['cpu_ratio']['replay']:.2f} (target: within "
            "15 %). \"lookup buffers\": the buffers one primary-key lookup touches "
            "(`EXPLAIN (ANALYZE, BUFFERS)`), the index's depth plus the row's page.")

    def pooled(self, p: dict[str, Any]) -> None:
        runs = p["runs"]
        labels = list(runs)
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(9, 3.2))
        x = range(len(labels))
        left.bar([i - 0.2 for i in x], [runs[k]["p50"] for k in labels], 0.4, label="p50")
        left.bar([i + 0.2 for i in x], [runs[k]["p99"] for k in labels], 0.4, label="p99")
        left.set(xticks=list(x), xticklabels=[f"{k}\n{runs[k]['db_clients']} clients"
                                              for k in labels], ylabel="ms",
                 title="key path latency")
        left.legend()
        right.bar(list(x), [runs[k]["error_rate"] * 100 for k in labels], 0.5, color="tab:red")
        right.set(xticks=list(x), xticklabels=labels, ylabel="% of requests",
                  title="errors (non-2xx and socket)")
        self.save(fig, "connections")
        body = table(
            ["database path", "database clients", "server sessions", "requests/s",
             "p50 / p99 / max ms", "errors", "longest wait for a server"],
            [[k, n(r["db_clients"]), n(r["server_sessions"]), n(r["rate"]),
              f"{ms(r['p50'])} / {ms(r['p99'])} / {ms(r['max'])}",
              f"{r['non2xx'] + r['errors']:,.0f} of {r['requests']:,.0f} "
              f"({r['error_rate'] * 100:.2f} %)",
              f"{r['pool']['maxwait_ms_max']:,.0f} ms" if r.get("pool") else "—"]
             for k, r in runs.items()])
        self.section(
            "Many connections: pgbouncer in transaction mode", p["run"],
            figure("connections", "latency and errors through pgbouncer and direct"), body,
            f"wrk with {p['clients']} connections, half new keys and half replays, for "
            f"{p['seconds']} s; gunicorn gthread workers, one database client per thread; the "
            f"pool holds {p['server_sessions']} server sessions. The direct run gives the "
            f"same traffic {p['server_sessions']} direct sessions.")

    def reaper(self, p: dict[str, Any]) -> None:
        fig, ax = self.plt.subplots(figsize=(6, 3.2))
        labels = ["before", "while reaping", "after"]
        values = [p["before"]["p99"], p["during"]["p99"], p["after"]["p99"]]
        ax.bar(labels, values, color=["tab:blue", "tab:orange", "tab:blue"])
        ax.axhline((values[0] + values[2]) / 2 * 1.1, color="grey", linestyle=":",
                   label="+10 % of the baseline")
        ax.set(ylabel="live p99, ms",
               title=f"{p['keys']:,} expired keys at {p['rate']:,.0f}/s")
        ax.legend()
        self.save(fig, "reaper")
        report = p["report"]
        s = p["sizes"]
        body = table(
            ["expired keys", "reaping time", "keys/s", "longest batch", "live p99 without → with",
             "ratio"],
            [[n(p["keys"]), f"{report['seconds']:,.1f} s", n(p["rate"]),
              f"{report['longest_batch_seconds'] * 1000:.1f} ms",
              f"{(p['before']['p99'] + p['after']['p99']) / 2:.1f} → {p['during']['p99']:.1f} ms",
              f"{p['p99_ratio']:.2f}"]])
        body += "\n\n" + table(
            ["idempotency_keys", "heap", "indexes", "rows", "dead rows (estimated)"],
            [[label, mb(s[label]["heap"]),
              ", ".join(f"{k} {mb(x)}" for k, x in s[label]["indexes"].items()),
              n(s[label].get("rows", s[label]["live"])), n(s[label]["dead"])]
             for label in ("seeded", "reaped", "vacuumed") if label in s])
        self.section(
            "Reaper: expired keys deleted under live traffic", p["run"],
            figure("reaper", "live p99 before, during and after reaping"), body,
            f"Beside {p['live']:,} live keys; the traffic is paced (8 connections, 20 ms "
            "between requests, half new keys, half replays over every tenant). Sizes: after "
            "seeding, right after the reap, and after a plain VACUUM.")

    def churn(self, p: dict[str, Any]) -> None:
        fig, ax = self.plt.subplots(figsize=(7, 3.4))
        for variant, style in (("default", "-"), ("tuned", "--")):
            samples = p["variants"].get(variant, {}).get("samples", [])
            if not samples:
                continue
            steps = [s["step"] for s in samples]
            ax.plot(steps, [s["heap"] / 2**20 for s in samples], style, color="tab:blue",
                    label=f"heap ({variant})")
            ax.plot(steps, [sum(s["indexes"].values()) / 2**20 for s in samples], style,
                    color="tab:green", label=f"indexes ({variant})")
        ax.set(xlabel=f"step (a day in {p['steps']} steps)", ylabel="MB",
               title=f"idempotency_keys through a day of churn, {p['keys']:,} live keys",
               ylim=(0, None))
        ax.legend(fontsize="small")
        self.save(fig, "churn")
        rows = []
        for variant, v in p["variants"].items():
            first, last = v["samples"][0], v["samples"][-1]
            rows.append([variant, mb(first["heap"]), mb(last["heap"]),
                         mb(sum(first["indexes"].values())), mb(sum(last["indexes"].values())),
                         n(last["dead"]), str(last["autovacuums"])])
        tuned = ", ".join(f"`{k} = {v}`"
                          for k, v in p["variants"].get("tuned", {}).get("settings", {}).items())
        self.section(
            "Keys: a day of churn", p["run"],
            figure("churn", "heap and index size through a day of churn"),
            table(["autovacuum", "heap at the start", "heap after the day", "indexes at the "
                   "start", "indexes after", "dead rows at the end", "autovacuums"], rows),
            f"A day compressed into {p['steps']} steps of {p['step_seconds']:g} s: each step "
            f"inserts a step's new keys (random keys, as clients make them) and runs the reaper "
            f"once. \"tuned\": {tuned}. autovacuum_naptime is the cluster's "
            f"({p['naptime']}): a compressed day gives autovacuum fewer chances than a real "
            "one, so these sizes are an upper bound.")

    def tenants(self, p: dict[str, Any]) -> None:
        points = p["points"]
        locks = p.get("tenants_per_transaction", {})
        x = [q["tenants"] for q in points]
        fig, (left, right) = self.plt.subplots(1, 2, figsize=(10, 3.4))
        left.plot(x, [q["throughput"] for q in points], marker="o")
        left.axhline(points[0]["throughput"] * 0.8, color="grey", linestyle=":")
        left.set(xscale="log", xlabel="tenants publishing", ylabel="messages/s",
                 title="relay throughput (dotted: -20 %)", ylim=(0, None))
        right.plot(x, [q["latency"]["p50"] for q in points], marker="o", label="p50")
        right.plot(x, [q["latency"]["p99"] for q in points], marker="o", label="p99")
        right.set(xscale="log", xlabel="tenants publishing", ylabel="ms",
                  title="commit → broker", ylim=(0, None))
        right.legend()
        self.save(fig, "tenants")
        body = table(
            ["tenants", "relay messages/s", "relay CPU µs/message", "commit→broker p50 / p99",
             "one transaction for every tenant"],
            [[n(q["tenants"]), n(q["throughput"]), f"{q['relay_cpu_us']:.0f}",
              f"{ms(q['latency']['p50'])} / {ms(q['latency']['p99'])} ms",
              q["one_transaction"]["summary"]] for q in points])
        self.section(
            "Outbox: tenants publishing", p["run"],
            figure("tenants", "relay throughput and latency against tenants publishing"), body,
            f"Throughput: a backlog of {p['backlog']:,} messages over the tenants, drained by "
            f"`Relay.drain()` while {p['publishers']} publishers keep transactions in flight "
            f"(20 ms each, {p['rate']:g} messages/s in all). Latency: `relay_outbox` at "
            f"{p['rate']:g} messages/s. Largest against fewest tenants: ×"
            f"{p['ratio_last_first']:.2f} (target: within 20 %)."
            + (" One transaction publishing for N tenants, with nothing else running "
               f"(max_locks_per_transaction {locks['max_locks_per_transaction']}): "
               + ", ".join(f"{int(k):,}: {v}" for k, v in locks["tried"].items()) + "."
               if locks else ""))

    def backlog(self, p: dict[str, Any]) -> None:
        modes = p["modes"]
        fig, axes = self.plt.subplots(1, 3, figsize=(12, 3.4))
        for mode, run in modes.items():
            samples = run["samples"]
            t = [s["t"] for s in samples]
            marks = run.get("marks") or [[s["t"], s["delivered"]] for s in samples]
            (line,) = axes[0].plot([m[0] for m in marks], [m[1] for m in marks], label=mode)
            color = line.get_color()
            axes[1].plot(t, [s["rss_mb"] for s in samples], color=color, label=mode)
            axes[2].plot(t, [s["health_lag_s"] for s in samples], color=color,
                         label=f"{mode}: health lag (s)")
            axes[2].plot(t, [s["health_ms"] / 1000 for s in samples], ":", color=color,
                         label=f"{mode}: health check took (s)")
        axes[0].set(xlabel="s after the broker came back", ylabel="messages delivered",
                    title="drain")
        axes[0].legend()
        axes[1].set(xlabel="s", ylabel="MB", title="relay RSS", ylim=(0, None))
        axes[2].set(xlabel="s", title="lag as reported", ylim=(0, None))
        axes[2].legend(fontsize="small")
        self.save(fig, "backlog")
        rows = []
        for mode, run in modes.items():
            samples = run["samples"]
            rss = [s["rss_mb"] for s in samples]
            rows.append([
                mode, n(run["held"]), f"{run['resumed_after_s']:.1f} s",
                n(run["rate"]) + ("" if run["complete"] else f" ({n(run['delivered'])} only)"),
                ", ".join(n(r) for r in run["decile_rates"]),
                f"{min(rss):.0f}–{max(rss):.0f} MB" if rss else "—",
                f"{statistics.median(s['health_ms'] for s in samples):.0f} / "
                f"{max(s['health_ms'] for s in samples):.0f} ms" if samples else "—",
                f"{statistics.median(s['metrics_ms'] for s in samples):.0f} / "
                f"{max(s['metrics_ms'] for s in samples):.0f} ms" if samples else "—"])
        self.section(
            "Outbox: a backlog after a broker outage", p["run"],
            figure("backlog", "drain, relay memory and reported lag over time"),
            table(["backlog written", "tenants held", "resumed after", "drain messages/s",
                   "messages/s by tenth of the backlog", "relay RSS", "health check p50 / max",
                   "metrics scrape p50 / max"], rows),
            f"{p['messages']:,} messages over 100 tenants, inserted while Redis is stopped "
            f"(`scripts/services stop redis`, {p['outage_s']:g} s); `relay_outbox` runs "
            "throughout. *outage*: a message committed first, which the relay keeps failing to "
            "send, so it stays put; *bulk*: the relay had nothing to send while the backlog's "
            "transactions (50,000 messages of 100 tenants each) were open, so it moved past "
            "them holding those tenants back. Health (`outbox.health.check()`) and the metrics "
            "collector are asked once a second.")

    def retention(self, p: dict[str, Any]) -> None:
        samples = p["samples"]
        t = [s["t"] for s in samples]
        fig, ax = self.plt.subplots(figsize=(7, 3.4))
        ax.plot(t, [s["rows"] for s in samples], label="rows")
        ax.axhline(p["expected_rows"], color="grey", linestyle=":", label="expected steady rows")
        ax.set(xlabel="s", ylabel="rows", title="outbox_messages under retention", ylim=(0, None))
        twin = ax.twinx()
        twin.plot(t, [s["heap"] / 2**20 for s in samples], color="tab:orange", label="heap MB")
        twin.set(ylabel="heap MB", ylim=(0, None))
        ax.legend(loc="upper left", fontsize="small")
        twin.legend(loc="lower right", fontsize="small")
        self.save(fig, "retention")
        rows = [[f"{p['rate_per_hour']:,} / hour", f"{p['retention_s']:g} s",
                 f"{p['reap_every_s']:g} s", n(p["expected_rows"]),
                 n(max(s["rows"] for s in samples)) if samples else "—",
                 mb(p["heap_middle"]) if "heap_middle" in p else "—",
                 mb(p["heap_last"]) if "heap_last" in p else "—"]]
        self.section(
            "Outbox: retention at a steady rate", p["run"],
            figure("retention", "rows and heap size of outbox_messages over time"),
            table(["published", "RETENTION", "reap_outbox every", "expected rows",
                   "most rows seen", "heap, middle third", "heap, last third"], rows),
            f"{p['duration_s']:g} s of publishing; `relay_outbox` keeps up; `reap()` (what "
            "`reap_outbox` runs) on schedule. Steady means the heap of the last third is no "
            "larger than the middle third's.")

    def consumers(self, p: dict[str, Any]) -> None:
        runs = p["runs"]
        names = list(next(iter(runs.values()))["consumers"])
        fig, ax = self.plt.subplots(figsize=(9, 3.4))
        width = 0.8 / len(runs)
        for i, (label, run) in enumerate(runs.items()):
            ax.bar([j + i * width for j in range(len(names))],
                   [run["consumers"][c]["p99"] for c in names], width, label=f"p99, {label}")
        ax.set(xticks=[j + width * (len(runs) - 1) / 2 for j in range(len(names))],
               xticklabels=names,
               ylabel="ms", title="each consumer's publish → handle p99")
        ax.legend()
        self.save(fig, "consumers")
        rows = []
        for label, run in runs.items():
            values = run["consumers"].values()
            rows.append([label, n(run["published"]),
                         f"{min(v['p50'] for v in values):.1f}–{max(v['p50'] for v in values):.1f}",
                         f"{min(v['p99'] for v in values):.1f}–{max(v['p99'] for v in values):.1f}",
                         n(run.get("behind_rate", 0)) if "behind_rate" in run else "—",
                         " / ".join(f"{run['cpu_s'][k]:.1f}" for k in ("ten", "behind",
                                                                      "postgresql"))
                         + f" in {run['window_s']:.0f} s" if "cpu_s" in run else "—"])
        self.section(
            "Consumers: ten on one stream, and one far behind", p["run"],
            figure("consumers", "each consumer's p99 alone and with one consumer far behind"),
            table(["run", "messages", "p50 ms (range over the ten)", "p99 ms (range)",
                   "the one behind, ids passed/s",
                   "CPU seconds: the ten / the one behind / PostgreSQL"], rows),
            f"Each consumer in a `run_consumers` process of its own, {p['rate']:g} messages/s "
            f"for {p['seconds']:g} s; the eleventh starts {p['behind']:,} messages behind.")

    def section(self, title: str, run: dict[str, Any], image: str, body: str, note: str) -> None:
        self.parts.append(f"#### {title}\n\n{run_line(run)}\n\n{image}\n\n{body}\n\n{note}\n")

    def write(self) -> str:
        for name in ("keys", "pooled", "reaper", "churn", "tenants", "backlog", "retention",
                     "consumers"):
            if name in self.phases:
                getattr(self, name)(self.phases[name])
        if not self.parts:
            return "*No figures yet: run `make bench-scale`.*\n"
        return "\n".join(self.parts)


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "results" / "scale.json"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("scale_report: matplotlib is missing: make bench-scale installs the 'bench' "
                 "dependency group (pip install --group bench)")
    text = Report(json.loads(source.read_text())).write()
    page = PAGE.read_text()
    if BEGIN not in page or END not in page:
        sys.exit(f"scale_report: {PAGE} has no bench-scale markers")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n\n{text}\n{END}{tail}")
    print(f"scale_report: {len(list(IMAGES.glob('*.png')))} plots in "
          f"{IMAGES.relative_to(ROOT)}, tables in {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
