from __future__ import annotations

import getpass
import json
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.management import one_line_errors


def _row_id(value: str) -> tuple[int, int]:
    try:
        tenant, row = value.split("/")
        return int(tenant), int(row)
    except ValueError:
        raise CommandError(f"{value!r} is not TENANT/ID (as listed by outbox_parked)") from None


class Command(BaseCommand):
    help = ("List messages parked by consumers (TENANT/ID: show them whole); with --redrive, "
            "handle them again (each deleted once its handler succeeds); with --discard, delete "
            "them unhandled; with --background, ask a job to do either; with --work, do the jobs.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="TENANT/ID", help="dead-letter rows")
        parser.add_argument("--consumer", help="only this consumer's")
        parser.add_argument("--tenant", type=int, help="only this tenant's")
        parser.add_argument("--topic", help="only this topic's (with --background)")
        parser.add_argument("--search", default="",
                            help="only those whose key, topic, consumer or error contains each "
                                 "word, or whose message id it is (with --background)")
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--redrive", action="store_true", help="handle them again")
        what.add_argument("--discard", action="store_true", help="delete them unhandled")
        what.add_argument("--work", action="store_true",
                          help="do the re-drive and discard jobs that wait, then exit")
        what.add_argument("--jobs", action="store_true", help="list the jobs, newest first")
        parser.add_argument("--background", action="store_true",
                            help="with --redrive or --discard: ask for a job, do nothing here")
        parser.add_argument("--every", type=float, metavar="SECONDS",
                            help="with --work: look for jobs every SECONDS until SIGTERM")
        parser.add_argument("--limit", type=int, default=100, help="rows listed (default 100)")

    def handle(self, *args: Any, **options: Any) -> None:
        with one_line_errors():
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        from outbox.deadletters import discard, enqueue, list_parked, redrive

        ids = [_row_id(v) for v in options["ids"]] or None
        by = f"{getpass.getuser()} (manage.py outbox_parked)"
        if options["background"] and not (options["redrive"] or options["discard"]):
            raise CommandError("--background asks for a job: give --redrive or --discard")
        if options["every"] is not None and not options["work"]:
            raise CommandError("--every is for --work")
        if options["work"]:
            return self._work(options["every"], options["verbosity"])
        if options["jobs"]:
            return self._jobs(options["limit"])
        if (options["topic"] or options["search"]) and not options["background"]:
            raise CommandError("--topic and --search select the rows of a job: add --background")
        if options["background"]:
            job = enqueue(
                "redrive" if options["redrive"] else "discard", consumer=options["consumer"],
                topic=options["topic"], search=options["search"], rows=ids,
                tenants=None if options["tenant"] is None else [options["tenant"]],
                requested_by=by)
            self.stdout.write(f"job {job.pk}: {job.get_action_display()} {job.total} parked "
                              "message(s); `outbox_parked --work` does it")
            return None
        if options["redrive"]:
            result = redrive(options["consumer"], ids, tenant_id=options["tenant"], by=by)
            self.stdout.write(
                f"re-driven: {result.handled} handled, {result.failed} failed again, "
                f"{result.missing} not found"
            )
            if result.failed:
                raise CommandError(f"{result.failed} parked message(s) failed again")
            return None
        if options["discard"]:
            if ids is None:
                raise CommandError("--discard needs TENANT/ID arguments (or --background, for "
                                   "everything --consumer, --tenant, --topic, --search match)")
            self.stdout.write(f"discarded: {discard(ids, by=by)}")
            return None
        if ids is not None:
            return self._show(ids)
        rows = list_parked(options["consumer"], options["tenant"], options["limit"])
        for p in rows:
            error = (p.error.strip().splitlines() or [""])[-1]
            if options["verbosity"] < 2:
                error = error[:80]
            self.stdout.write(
                f"{p.tenant_id}/{p.id}  {p.consumer}  {p.topic}  key={p.key}  "
                f"attempts={p.attempts}  parked={p.parked_at:%Y-%m-%d %H:%M:%S}  {error}"
            )
        self.stdout.write(f"{len(rows)} parked message(s)")
        return None

    def _show(self, ids: list[tuple[int, int]]) -> None:
        from outbox.models import DeadLetter
        from tenancy.aliases import system_alias

        for tenant, row_id in ids:
            row = DeadLetter.objects.using(system_alias()).filter(
                tenant_id=tenant, id=row_id).first()
            if row is None:
                raise CommandError(f"no parked message {tenant}/{row_id}")
            failed = (f", last re-drive failed {row.redrive_failed_at:%Y-%m-%d %H:%M:%S}"
                      if row.redrive_failed_at else "")
            self.stdout.write(
                f"{tenant}/{row_id}  {row.consumer}  {row.topic}  key={row.key}  "
                f"message {row.message_id} (outbox {tenant}/{row.message_pk}, published "
                f"{row.message_created_at:%Y-%m-%d %H:%M:%S})\n"
                f"attempts={row.attempts}  parked={row.parked_at:%Y-%m-%d %H:%M:%S}{failed}\n"
                f"payload: {json.dumps(row.payload, sort_keys=True)}\n"
                f"headers: {json.dumps(row.headers, sort_keys=True)}\n"
                f"{row.error}\n")

    def _jobs(self, limit: int) -> None:
        from outbox.deadletters import describe
        from outbox.models import ParkedJob
        from tenancy.aliases import system_alias

        for job in ParkedJob.objects.using(system_alias()).order_by("-id")[:limit]:
            done = job.handled + job.failed + job.missing
            self.stdout.write(
                f"job {job.pk}  {job.get_action_display()}  {job.state}  {done}/{job.total}  "
                f"handled={job.handled} failed={job.failed} missing={job.missing}  "
                f"by {job.requested_by}  {describe(job)}"
                + (f"  stopped: {job.last_error}" if job.last_error else ""))

    def _work(self, every: float | None, verbosity: int) -> None:
        from outbox.deadletters import work
        from outbox.loops import run_loop, stop_on_signals
        from outbox.models import ParkedJob

        def report(job: ParkedJob) -> None:
            if verbosity >= 2:
                self.stdout.write(f"job {job.pk}: {job.handled + job.failed + job.missing}"
                                  f"/{job.total}")

        def step() -> bool:
            for job in work(progress=report, stop=stop.is_set):
                self.stdout.write(
                    f"job {job.pk} {job.state}: {job.handled} handled, {job.failed} "
                    f"failed again, {job.missing} no longer parked"
                    + (f" ({job.last_error})" if job.last_error else ""))
            return False

        stop = threading.Event()
        with stop_on_signals(stop):
            run_loop(step, name="outbox_parked --work", stop=stop, once=every is None, idle=every)
