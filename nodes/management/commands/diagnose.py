"""``manage.py diagnose BUNDLE [--json]``: why a launch failed, from a bundle folder or archive.

Exit 0 with the diagnosis; with ``--json`` stdout holds only ``{"category",
"secondary_categories", "summary", "evidence", "remedy", "numbers", "change"}``. ``change`` is
the suggested flags as an object (``{"--hicache-size": 37, "--mem-fraction-static": 0.69}``:
keys as spelled on the command line, a JSON number where the flag takes one, ``true`` for a
switch to add, ``null`` to drop a flag and its argument), computed with the budget arithmetic on
the bundle's node and checked by it (``services.bundle_fix``); ``null`` when there is none.
Exit 2 when BUNDLE is not a readable ``rankwise-case/1`` bundle.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes.domain.bundle import BundleError
from nodes.domain.redact import mask_assignments
from nodes.domain.remedy import describe
from nodes.management.cli import OneLineCommand
from nodes.services.bundle_fix import change_of
from nodes.services.bundles import diagnose_bundle, read_bundle


class Command(OneLineCommand):
    help = "Diagnose a failed launch from its bundle (a folder or a .tar.gz)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("bundle", help="A rankwise-case/1 folder or .tar.gz archive")
        parser.add_argument("--json", action="store_true", help="Print only one JSON document")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            log, facts = read_bundle(options["bundle"])
        except BundleError as exc:
            raise CommandError(str(exc), returncode=2) from None
        except OSError as exc:
            raise CommandError(f"{options['bundle']}: {exc.strerror}", returncode=2) from None
        found = diagnose_bundle(log, facts)
        doc = found.to_json()
        doc["change"] = change_of(found, facts)
        # Evidence quotes the log, which may spell out secrets (HF_TOKEN=…, --api-key …).
        doc["summary"] = mask_assignments(doc["summary"])
        for item in doc["evidence"]:
            item["text"] = mask_assignments(item["text"])
        if options["json"]:
            self.stdout.write(json.dumps(doc))
            return
        lines = [f"{doc['category']}: {doc['summary']}", f"fix: {doc['remedy']}"]
        if doc["change"]:
            lines.append(f"change: {describe(doc['change'])}")
        for item in doc["evidence"]:
            where = f"line {item['line']}" if item["line"] else item["source"]
            lines.append(f"  {where}: {item['text']}")
        for line in lines:
            # A bundle's text may hold what no terminal encoding can print (a lone surrogate).
            self.stdout.write(line.encode("utf-8", "replace").decode("utf-8"))
