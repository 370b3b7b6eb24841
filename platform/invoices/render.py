"""An invoice as CSV, HTML and PDF, each from the JSON view's own strings (`InvoiceView`),
so the four can never disagree on a line or a total.

The PDF is drawn with fpdf2 (pure Python, no system libraries: API nodes stay slim). Its
built-in Helvetica covers Latin-1 only, so a character outside it (a tenant named in
another script) is printed as `?` there; the HTML and JSON keep the name as it is.
"""

from __future__ import annotations

import csv
import io
from functools import cache

from fpdf import FPDF
from fpdf.enums import XPos, YPos
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

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


def _latin1(text: str) -> str:
    return text.encode("latin-1", "replace").decode("latin-1")


def invoice_pdf(doc: InvoiceDoc) -> bytes:
    view = InvoiceView.of(doc)
    pdf = FPDF(orientation="landscape", format="A4")
    pdf.set_title(_latin1(doc.title))
    pdf.set_author(_latin1(doc.issuer_name))
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 16)
    pdf.cell(0, 10, _latin1(doc.title), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font("Helvetica", "", 10)
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
        pdf.cell(0, 6, _latin1(fact), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.ln(4)
    pdf.set_font("Helvetica", "", 8)
    heading = ("Line", "Requests", "Input tok.", "Cached tok.", "Output tok.",
               "Price in/cached/out per 1M", "Amount", "Credits")  # fmt: skip
    with pdf.table(
        col_widths=(90, 16, 20, 20, 20, 50, 25, 25),
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
                    _latin1(line.description),
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
    pdf.set_font("Helvetica", "", 10)
    for label, value in (
        ("Subtotal", view.subtotal),
        ("Credits applied", view.credits_applied),
    ):
        pdf.cell(0, 6, f"{label}: {value} {view.currency}", new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.set_font("Helvetica", "B", 12)
    pdf.cell(0, 8, f"Amount due: {view.amount_due} {view.currency}",
             new_x=XPos.LMARGIN, new_y=YPos.NEXT)  # fmt: skip
    if doc.status == "draft":
        pdf.set_font("Helvetica", "I", 9)
        pdf.cell(0, 6, "Draft: the month is open; lines change until it is finalized.")
    return bytes(pdf.output())


def invoice_table(doc: InvoiceDoc) -> Markup:
    """The lines and totals alone (escaped here), for a page that has its own layout (/ui)."""
    view = InvoiceView.of(doc)
    return Markup(environment().get_template("invoice_table.html").render(invoice=view))  # noqa: S704
