"""Invoice months: a tenant's calendar month in its own time zone, as a UTC range.

The month is cut at local midnights with the digests' own day window
(`local_day_window`), so an invoice and a digest agree on which day an entry fell on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

from hydrant.platform.digests.figures import local_day_window
from hydrant.platform.errors import InvalidRequest

MONTH = re.compile(r"^(2\d{3})-(\d{2})$")  # the years 2000-2999: every window computes


@dataclass(frozen=True, order=True)
class Month:
    year: int
    month: int

    @classmethod
    def parse(cls, text: str, param: str = "month") -> Month:
        """`YYYY-MM` (2000-2999); 400 for anything else."""
        found = MONTH.match(text)
        if found is None or not 1 <= int(found.group(2)) <= 12:
            raise InvalidRequest(f"{text!r} is not a month (YYYY-MM)", param=param)
        return cls(int(found.group(1)), int(found.group(2)))

    @classmethod
    def of(cls, moment: datetime, zone: ZoneInfo) -> Month:
        """The month `moment` falls in, in `zone`."""
        local = moment.astimezone(zone)
        return cls(local.year, local.month)

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    def next(self) -> Month:
        return Month(self.year + 1, 1) if self.month == 12 else Month(self.year, self.month + 1)

    def previous(self) -> Month:
        return Month(self.year - 1, 12) if self.month == 1 else Month(self.year, self.month - 1)

    def window(self, zone: ZoneInfo) -> tuple[datetime, datetime]:
        """`[start, end)` in UTC: from the local midnight of its first day to the next month's."""
        start, _ = local_day_window(date(self.year, self.month, 1), zone)
        following = self.next()
        end, _ = local_day_window(date(following.year, following.month, 1), zone)
        return start.astimezone(UTC), end.astimezone(UTC)

    def __str__(self) -> str:
        return self.label
