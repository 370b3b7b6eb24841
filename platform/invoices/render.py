"""An invoice as CSV, HTML and PDF, each from the JSON view's own strings (`InvoiceView`),
so the four can never disagree on a line or a total.

The PDF is drawn with fpdf2 (pure Python, no system libraries: API nodes stay slim) in a
Unicode TrueType font found on the machine and embedded, so a tenant named in another
script prints as it is; without one, in Latin-1 Helvetica, with what it cannot draw
replaced visibly and said in a note (pdf_font.py).
"""

from __future__ import annotations

import csv
import io
from functools import cache

from fpdf import FPDF
from fpdf.enums import XPos, YPos
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from hydrant.platform.invoices.pdf_font import FAMILY, PdfFont, PdfText, system_font
from hydrant.platform.invoices.schemas import InvoiceView, LineView
from hydrant.platform.invoices.statement import InvoiceDoc

CSV_MEDIA_TYPE = "text/csv"
PDF_MEDIA_TYPE = "application/pdf"
LINE_COLUMNS: tuple[str, ...] = LineView.__struct_fields__
CSV_COLUMNS = ("invoice", "number", "status", "period", "currency", *LINE_COLUMNS)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def download_name(doc: InvoiceDoc, extension: str) -> str:
    """`HYD-2026-000123.pdf`, or `draft-2026-12.pdf`: safe in a Content-Disposition header."""
    return f"{doc.number or 'draft-' + doc.period}.{extension}"


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text  # never a formula


def invoice_csv(doc: InvoiceDoc) -> str:
    """One row per line; the totals are the JSON's (a totals row would be summed twice)."""
    view = InvoiceView.of(doc)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    head = (view.id, view.number or "", view.status, view.period, view.currency)
    for line in view.lines:
        values = [getattr(line, c) for c in LINE_COLUMNS]
        writer.writerow([*head, *(_cell(v) for v in values)])
    return buffer.getvalue()


@cache
def environment() -> Environment:
    return Environment(
        loader=PackageLoader("hydrant.platform.invoices", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html",)),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def invoice_html(doc: InvoiceDoc) -> str:
    """The whole invoice as one standalone page (its own styles: it is saved and printed)."""
    view = InvoiceView.of(doc)
    return environment().get_template("invoice.html").render(doc=doc, invoice=view)


def invoice_pdf(doc: InvoiceDoc) -> bytes:
    """The invoice as a PDF in the machine's Unicode font (Helvetica when it has none)."""
    return draw_invoice_pdf(doc, system_font())


def _use(pdf: FPDF, font: PdfFont | None) -> None:
    if font is None:
        return
    for style, face in (("", font.regular), ("B", font.bold), ("I", font.italic)):
        pdf.add_font(FAMILY, style, str(face))


def draw_invoice_pdf(doc: InvoiceDoc, font: PdfFont | None) -> bytes:
    """The invoice as a PDF in `font` (embedded), or in Helvetica when None."""
    view = InvoiceView.of(doc)
    text = PdfText(font)
    family = text.family
    pdf = FPDF(orientation="landscape", format="A4")
    _use(pdf, font)
    pdf.set_title(doc.title)
    pdf.set_author(doc.issuer_name)
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font(family, "B", 16)
    pdf.cell(0, 10, text(doc.title), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font(family, "", 10)
    facts = [
        f"Issued by: {doc.issuer_name}",
        f"Billed to: {doc.tenant_name} ({doc.tenant_id})",
        f"Period: {view.period} ({view.timezone}), "
        f"{view.period_start:%Y-%m-%d %H:%M} to {view.period_end:%Y-%m-%d %H:%M} UTC",
        f"Status: {view.status}"
        + (f", finalized {view.finalized_at:%Y-%m-%d %H:%M} UTC" if view.finalized_at else ""),
        f"Currency: {view.currency}",
    ]
    for fact in facts:
        pdf.cell(0, 6, text(fact), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.ln(4)
    pdf.set_font(family, "", 8)
    heading = ("Line", "Requests", "Input tok.", "Cached tok.", "Output tok.",
               "Price in/cached/out per 1M", "Amount", "Credits")  # fmt: skip
    with pdf.table(
        col_widths=(84, 20, 21, 22, 22, 48, 25, 25),  # wide enough for DejaVu Sans too
        text_align=("LEFT", "RIGHT", "RIGHT", "RIGHT", "RIGHT", "LEFT", "RIGHT", "RIGHT"),
        line_height=5,
    ) as table:
        table.row(heading)
        for line in view.lines:
            rates = "/".join(
                r or "-"
                for r in (line.input_per_mtok, line.cached_input_per_mtok, line.output_per_mtok)
            )
            table.row(
                (
                    text(line.description),
                    str(line.requests),
                    str(line.input_tokens),
                    str(line.cached_input_tokens),
                    str(line.output_tokens),
                    rates,
                    line.amount,
                    line.credits_applied,
                )
            )
    pdf.ln(4)
    pdf.set_font(family, "", 10)
    for label, value in (
        ("Subtotal", view.subtotal),
        ("Credits applied", view.credits_applied),
    ):
        pdf.cell(0, 6, f"{label}: {value} {view.currency}", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font(family, "B", 12)
    pdf.cell(0, 8, f"Amount due: {view.amount_due} {view.currency}",
             new_x=XPos.LMARGIN, new_y=YPos.NEXT)  # fmt: skip
    pdf.set_font(family, "I", 9)
    if doc.status == "draft":
        pdf.cell(0, 6, "Draft: the month is open; lines change until it is finalized.",
                 new_x=XPos.LMARGIN, new_y=YPos.NEXT)  # fmt: skip
    note = text.note()
    if note is not None:
        pdf.multi_cell(0, 5, note)
    return bytes(pdf.output())


def invoice_table(doc: InvoiceDoc) -> Markup:
    """The lines and totals alone (escaped here), for a page that has its own layout (/ui)."""
    view = InvoiceView.of(doc)
    return Markup(environment().get_template("invoice_table.html").render(invoice=view))  # noqa: S704
