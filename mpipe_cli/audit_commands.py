"""`mpipe audit`: who changed the library and the run queue, and what was refused.

    mpipe audit [--since WHEN] [--user U] [--schedule NAME] [--run ID] [--limit N] [--json]

WHEN is a date or a time (`2026-05-01`, `2026-05-01T14:30`, local time unless
it names its offset) or an age (`90s`, `30m`, `12h`, `7d`, `2w`).
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from mpipe_core.errors import MpipeError
from mpipe_core.workloads.inputs import check_text

from .arg_types import add_db_argument, int_in
from .storage_commands import RUN_ID, _print_json, _table, _when

AGE = re.compile(r"(\d{1,6})([smhdw])\Z")
AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class BadSinceError(MpipeError):
    """A --since value that is neither a date, a time nor an age."""


def register(subparsers) -> None:
    p = subparsers.add_parser("audit", help="who changed the library and the run queue (and what was refused)",
                              description=__doc__.splitlines()[0])
    add_db_argument(p)
    p.add_argument("--since", metavar="WHEN", default=None,
                   help="from this date or time (2026-05-01, 2026-05-01T14:30) or this long ago (30m, 12h, 7d)")
    p.add_argument("--user", metavar="U", default=None,
                   help="only what U did (a signed-in identity, a local user, or a database user)")
    p.add_argument("--schedule", metavar="NAME", default=None, help="only what touched schedule NAME")
    p.add_argument("--run", type=RUN_ID, metavar="ID", default=None, help="only what touched run ID")
    p.add_argument("--limit", type=int_in(1, 1_000_000), default=200, help="newest N entries (default 200)")
    p.add_argument("--json", action="store_true", help="JSON on stdout")
    p.set_defaults(handler=cmd_audit)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A --since value as an aware UTC time (a time without an offset is local)."""
    value = text.strip()
    age = AGE.match(value)
    if not age:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise BadSinceError(f"--since {text[:40]!r}: expected a date or time (2026-05-01, 2026-05-01T14:30) "
                                f"or an age (30m, 12h, 7d)") from None
    try:
        if age:
            now = now or datetime.now(timezone.utc)
            return now - timedelta(**{AGE_UNITS[age.group(2)]: int(age.group(1))})
        if when.tzinfo is None:
            when = when.astimezone()  # local time, as the listing shows it
        return when.astimezone(timezone.utc)
    except (ValueError, OverflowError):  # 999999w ago, or a time that leaves years 1..9999 in UTC
        raise BadSinceError(f"--since {text[:40]!r}: out of range (years 1 to 9999)") from None


def _details(details: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in details.items())


def cmd_audit(args) -> int:
    from storage import list_audit, open_database
    from storage.library import check_name
    from storage.models import NAME_LENGTH

    since = parse_since(args.since) if args.since is not None else None
    if args.user is not None:
        check_text(args.user, "--user", NAME_LENGTH, single_line=True)  # the bounds of an author
    if args.schedule is not None:
        check_name(args.schedule)
    entries = list_audit(open_database(args.db), since=since, user=args.user, schedule=args.schedule,
                         run_id=args.run, limit=args.limit)
    if args.json:
        return _print_json(entries)
    if not entries:
        print("no audit entries" + (" match" if args.since or args.user or args.schedule or args.run else " yet"))
        return 0
    rows = [[_when(e.at), e.actor + (f" (db {e.db_user})" if e.db_user and e.db_user != e.actor else ""),
             e.role, e.via, e.action, e.target, e.outcome, _details(e.details)] for e in entries]
    _table(rows, ["WHEN", "WHO", "ROLE", "VIA", "ACTION", "TARGET", "OUTCOME", "DETAILS"])
    return 0
