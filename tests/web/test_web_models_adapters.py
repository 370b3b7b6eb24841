"""The models page tells a LoRA adapter's price-book row from a model's, and what it costs."""

from __future__ import annotations

import sys
from pathlib import Path

from control_plane_helpers import ControlPlane
from web_helpers import sign_in

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "adapters"))

from peft_dirs import write_adapter


async def test_adapters_show_their_base_and_its_price(
    cp: ControlPlane, tmp_path: Path, demo_model_dir: Path
) -> None:
    assert (await sign_in(cp.client, cp.admin_secret)).status_code == 303
    base = await cp.client.post(
        "/admin/models", json={"name": "demo", "path": str(demo_model_dir)}, headers=cp.admin
    )
    assert base.status_code == 201
    for name, price in (("sql", {"input_per_mtok": "0.7", "output_per_mtok": "0.9"}), ("c", None)):
        body = {"name": name, "path": str(write_adapter(tmp_path / name, demo_model_dir))}
        registered = await cp.client.post(
            "/admin/models/demo/adapters", json={**body, "price": price}, headers=cp.admin
        )
        assert registered.status_code == 201, registered.text
    page = (await cp.client.get("/ui/models")).text
    sql = page[page.index('data-model="demo:sql"') :].split("</tr>")[0]
    assert "LoRA adapter of demo" in sql and "0.700000" in sql
    plain = page[page.index('data-model="demo:c"') :].split("</tr>")[0]
    assert "the base model&#39;s price (demo)" in plain or "the base model's price (demo)" in plain
    demo = page[page.index('data-model="demo"') :].split("</tr>")[0]
    assert "LoRA adapter" not in demo and "no price yet" in demo
