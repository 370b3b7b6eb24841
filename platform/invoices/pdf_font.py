"""The invoice PDF's font: a Unicode TrueType font found on the machine, embedded (subset)
in the PDF, so a tenant or model named in any script it covers prints as it is.

Why search rather than ship one: the API image stays slim and a distribution's font
package (fonts-dejavu, fonts-noto, fonts-liberation) is the usual way a host has them.
With none found, the PDF falls back to fpdf2's built-in Helvetica, which covers Latin-1
only. Either way a character the font cannot draw is never dropped silently: it is
folded to its base letters when those are drawable (`Ő` -> `O`), else shown as U+FFFD
(`?` in Helvetica), and the PDF then says so in a note, pointing to the HTML and JSON
invoice, which carry every name exactly.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fontTools.ttLib import TTFont, TTLibError

log = logging.getLogger(__name__)

FONT_DIRS = (Path("/usr/share/fonts"),)
# (regular, bold, italic) file names, best first; the first family whose regular face is
# found wins (a missing bold or italic face is drawn with the regular one).
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf"),
    ("NotoSans-Regular.ttf", "NotoSans-Bold.ttf", "NotoSans-Italic.ttf"),
    ("LiberationSans-Regular.ttf", "LiberationSans-Bold.ttf", "LiberationSans-Italic.ttf"),
    ("FreeSans.ttf", "FreeSansBold.ttf", "FreeSansOblique.ttf"),
)
FAMILY = "invoice"  # the name the PDF registers the found font under
CORE_FAMILY = "Helvetica"
REPLACEMENT = "\ufffd"
NOTE = (
    "Some characters are not in this PDF's font: they are shown by their base letters or as"
    " {mark}. The HTML and JSON invoice show every name exactly."
)


@dataclass(frozen=True)
class PdfFont:
    """A TrueType family to embed: its faces and the code points its regular face draws."""

    regular: Path
    bold: Path
    italic: Path
    code_points: frozenset[int]


def find_font(roots: tuple[Path, ...] = FONT_DIRS) -> PdfFont | None:
    """The first family of `FAMILIES` found under `roots` (any depth); None when none is."""
    found: dict[str, Path] = {}
    wanted = {name for family in FAMILIES for name in family}
    for root in roots:
        if root.is_dir():
            for path in sorted(root.rglob("*.ttf")):
                if path.name in wanted:
                    found.setdefault(path.name, path)
    for regular, bold, italic in FAMILIES:
        if regular not in found:
            continue
        try:
            with TTFont(found[regular], lazy=True) as font:
                code_points = frozenset(font.getBestCmap() or {})
        except (OSError, TTLibError):
            log.warning("unreadable font; trying the next", extra={"font": str(found[regular])})
            continue
        base = found[regular]
        return PdfFont(base, found.get(bold, base), found.get(italic, base), code_points)
    return None


@cache
def system_font() -> PdfFont | None:
    """The machine's font for invoices, looked for once per process (logged when none)."""
    font = find_font()
    if font is None:
        log.warning("no TrueType font under %s: invoice PDFs use Latin-1 Helvetica", FONT_DIRS)
    return font


class PdfText:
    """Maps text to what the font can draw, and remembers whether anything was replaced."""

    def __init__(self, font: PdfFont | None) -> None:
        self.font = font
        self.replaced = False
        drawable = font is not None and ord(REPLACEMENT) in font.code_points
        self.mark = REPLACEMENT if drawable else "?"

    @property
    def family(self) -> str:
        return FAMILY if self.font is not None else CORE_FAMILY

    def _drawable(self, char: str) -> bool:
        if self.font is None:
            return ord(char) < 256  # Helvetica's Latin-1
        return ord(char) in self.font.code_points

    def __call__(self, text: str) -> str:
        out: list[str] = []
        for char in text:
            if self._drawable(char):
                out.append(char)
                continue
            self.replaced = True
            base = "".join(
                c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c)
            )
            out.append(base if base and all(self._drawable(c) for c in base) else self.mark)
        return "".join(out)

    def note(self) -> str | None:
        """What the PDF says when it could not draw every character; None when it could."""
        return NOTE.format(mark=self.mark) if self.replaced else None
