"""The invoice PDF names a tenant outside Latin-1 as it is: the machine's TrueType font is
found and embedded; a character that font lacks, and everything outside Latin-1 when no
font is found, is replaced visibly and said in a note. Through the real CLI and services
on the embedded SQLite, read back with pypdf."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from digest_factories import make_ledger, make_world, record
from invoice_factories import local
from pypdf import PdfReader

from hydrant.cli.main import cli
from hydrant.platform.console import admin_services
from hydrant.platform.db.session import Database
from hydrant.platform.invoices.pdf_font import REPLACEMENT, PdfFont, find_font
from hydrant.platform.invoices.render import draw_invoice_pdf
from hydrant.settings import load_settings

# Latin-1, Latin Extended (Ő), Greek and Cyrillic (in DejaVu Sans), and CJK (not in it)
NAME = "Ørsted Őrség Δέλτα Москва 東京"
NOTE = "The HTML and JSON invoice show every name exactly."


def machine_font() -> PdfFont:
    """The font the gateway would embed; its absence fails in CI, where the image has one."""
    font = find_font()
    if font is None:
        message = "no TrueType font under /usr/share/fonts (install fonts-dejavu-core)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    return font


def text_of(pdf: bytes) -> str:
    return "".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages)


def fonts_of(pdf: bytes) -> set[str]:
    page = PdfReader(io.BytesIO(pdf)).pages[0]
    fonts = page["/Resources"]["/Font"]
    return {str(fonts[name].get_object()["/BaseFont"]) for name in fonts}


async def _usage(url: str, data_dir: Path) -> str:
    db = Database(url)
    try:
        world = await make_world(db, name=NAME)
        await record(
            make_ledger(db, data_dir), world, key="backend", model="qwen-tiny",
            finished_at=local(2026, 11, 3, 8), tokens=(3000, 0, 700),
        )  # fmt: skip
        return world.tenant_id
    finally:
        await db.dispose()


def test_a_name_outside_latin1_prints_in_the_embedded_font(data_dir: Path, tmp_path: Path) -> None:
    font = machine_font()
    env = {"HYDRANT_DATA_DIR": str(data_dir), "HYDRANT_LOG_FORMAT": "text"}
    runner = CliRunner()
    assert runner.invoke(cli, ["tenants", "list"], env=env).exit_code == 0  # migrates
    settings = load_settings(env)
    tenant_id = asyncio.run(_usage(settings.effective_database_url, data_dir))
    target = tmp_path / "invoice.pdf"
    shown = runner.invoke(
        cli,
        ["billing", "invoices", "show", tenant_id, "2026-11", "--format", "pdf",
         "--output", str(target)],
        env=env,
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    pdf = target.read_bytes()
    text = text_of(pdf)
    assert "Ørsted Őrség Δέλτα Москва" in text
    assert "東京" not in text and REPLACEMENT * 2 in text  # DejaVu Sans has no CJK
    assert NOTE in " ".join(text.split())
    assert any(font.regular.stem in name for name in fonts_of(pdf))  # embedded, not core
    assert not any("Helvetica" in name for name in fonts_of(pdf))

    # The same invoice without a font: Helvetica, Latin-1 kept, Ő folded to O, the rest
    # marked, and the note.
    async def doc():  # type: ignore[no-untyped-def]
        async with admin_services(settings) as s:
            return await s.invoices.get(s.principal, tenant_id, "2026-11")

    plain = draw_invoice_pdf(asyncio.run(doc()), None)
    plain_text = text_of(plain)
    assert "Ørsted Orség ????? ?????? ??" in plain_text
    assert NOTE in " ".join(plain_text.split())
    assert all("Helvetica" in name for name in fonts_of(plain))


def test_the_font_search_takes_a_lone_regular_face_and_finds_nothing_in_an_empty_tree(
    tmp_path: Path,
) -> None:
    font = machine_font()
    assert find_font((tmp_path,)) is None
    nested = tmp_path / "truetype" / "some"
    nested.mkdir(parents=True)
    shutil.copy(font.regular, nested / font.regular.name)
    found = find_font((tmp_path,))
    assert found is not None
    assert found.regular == found.bold == found.italic == nested / font.regular.name
    assert ord("Ж") in found.code_points and ord("東") not in found.code_points
