from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from tenancy import verified
from tenancy.conf import tenancy_settings


class Command(BaseCommand):
    help = (
        "Install or remove the keys of the verified tenant context and turn the mode on or "
        "off (as the owner: --database with the alias that runs migrate). Without an action, "
        "show the mode, the installed key ids and whether the settings' key is accepted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            default="status",
            choices=["status", "add-key", "remove-key", "enable", "disable"],
            help='add-key installs the key of TENANCY["VERIFIED_CONTEXT"]; remove-key KEY_ID '
            "removes one; enable and disable switch the mode.",
        )
        parser.add_argument("key_id", nargs="?", help="The key id to remove (remove-key).")
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="Database alias of the owner role (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, using = options["action"], options["database"]
        if (action == "remove-key") != (options["key_id"] is not None):
            raise CommandError(
                "remove-key takes a KEY_ID" if action == "remove-key"
                else f"{action} takes no KEY_ID"
            )
        try:
            if action == "add-key":
                key = verified.signing_key()
                added = verified.add_key(using, key)
                self.stdout.write(
                    f"Installed key {key.key_id!r}." if added
                    else f"Key {key.key_id!r} was already installed; nothing changed."
                )
            elif action == "remove-key":
                verified.remove_key(using, options["key_id"])
                self.stdout.write(f"Removed key {options['key_id']!r}.")
            elif action == "enable":
                verified.enable(using)
                self.stdout.write(
                    "Verified mode on: the policies trust only tokens that verify "
                    "(app.tenant_token)."
                )
            elif action == "disable":
                verified.disable(using)
                self.stdout.write("Verified mode off: the policies trust app.tenant_id again.")
            else:
                self._status(using)
        except (ImproperlyConfigured, DatabaseError) as exc:
            raise CommandError(str(exc).strip().splitlines()[0]) from exc

    def _status(self, using: str) -> None:
        state = verified.status(using)
        if not state.migrated:
            raise CommandError(f"tenancy's migration has not run on {using!r}: run migrate")
        self.stdout.write(f"mode: {'verified' if state.verified else 'plain'}")
        if state.keys:
            for key in state.keys:
                self.stdout.write(f"key {key.key_id}: installed {key.installed_at:%Y-%m-%d %H:%M}")
        else:
            self.stdout.write("no key installed")
        signing = tenancy_settings.VERIFIED_CONTEXT
        if signing is None:
            self.stdout.write('settings: TENANCY["VERIFIED_CONTEXT"] is not set')
        else:
            accepted = verified.accepts(using, signing)
            self.stdout.write(
                f"settings: signing with {signing.key_id!r}, "
                + ("accepted by the database" if accepted else "NOT accepted by the database")
            )
