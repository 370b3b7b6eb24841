"""The sealed cookie that carries a new key's secret to its one showing.

The codec on its own (no server), then two real gateway apps on one database
with one server secret: the key is made on one and shown by the other, as
behind a load balancer with no session affinity.
"""

from __future__ import annotations

import re

from control_plane_helpers import SERVER_SECRET, ControlPlane, bearer
from litestar.testing import AsyncTestClient
from web_helpers import post_form, sign_in

from hydrant.platform.app import create_app
from hydrant.platform.services import build_services
from hydrant.web.reveal import COOKIE_PREFIX, REVEAL_PATH, TTL_S, Reveal, seal, unseal
from hydrant.web.session import SESSION_COOKIE, decode_session, derive_key

KEY = derive_key(b"s" * 32, "reveal")
REVEAL = Reveal("hyd_test_secret", "key_1", "hyd_test_abc", "ten_1", action="created")


def test_a_sealed_reveal_opens_once_for_its_session_token_and_time() -> None:
    token, value = seal(REVEAL, key=KEY, sid="sid-a", now=1000)
    assert REVEAL.secret not in value  # encrypted, not just signed
    assert unseal(value, key=KEY, sid="sid-a", token=token, now=1001) == REVEAL
    assert unseal(value, key=KEY, sid="sid-b", token=token, now=1001) is None  # another session
    assert unseal(value, key=KEY, sid="sid-a", token="other", now=1001) is None  # another page
    assert unseal(value, key=KEY, sid="sid-a", token=token, now=1000 + TTL_S) is None  # expired
    other_server = derive_key(b"t" * 32, "reveal")
    assert unseal(value, key=other_server, sid="sid-a", token=token, now=1001) is None
    assert unseal(value, key=KEY, sid="", token=token, now=1001) is None  # not signed in
    flipped = value[:20] + ("A" if value[20] != "A" else "B") + value[21:]
    for junk in (None, "", "x", "!!!!", flipped, "A" * 5000):
        assert unseal(junk, key=KEY, sid="sid-a", token=token, now=1001) is None


def test_every_seal_is_fresh() -> None:
    first = seal(REVEAL, key=KEY, sid="sid-a", now=1000)
    second = seal(REVEAL, key=KEY, sid="sid-a", now=1000)
    assert first[0] != second[0] and first[1] != second[1]  # new token, new nonce


async def test_a_key_made_on_one_gateway_is_shown_by_another_once(cp: ControlPlane) -> None:
    assert (await sign_in(cp.client, cp.admin_secret)).status_code == 303
    tenant = await cp.create_tenant("acme")
    path = f"/ui/tenants/{tenant['id']}"
    created = await post_form(cp.client, f"{path}/keys", {"name": "ci"}, token_from=path)
    assert created.status_code == 303
    shown_path = created.headers["location"]
    assert shown_path.startswith(REVEAL_PATH + "/")
    [set_cookie] = [
        h for h in created.headers.get_list("set-cookie") if h.startswith(COOKIE_PREFIX)
    ]
    assert f"Path={REVEAL_PATH}" in set_cookie  # sent to the reveal page only
    assert "HttpOnly" in set_cookie and "SameSite=lax" in set_cookie

    # A second gateway: its own app and process state, the same database and server secret.
    other = create_app(cp.settings, build_services(cp.settings, models=()))
    async with AsyncTestClient(other) as second:
        second.follow_redirects = False
        for c in cp.client.cookies.jar:  # the browser's cookies go wherever the LB sends it
            second.cookies.set(c.name, c.value or "", domain=c.domain, path=c.path)
        shown = await second.get(shown_path)
        assert shown.status_code == 200, shown.text
        match = re.search(r'id="secret" class="secret" type="text" value="([^"]+)"', shown.text)
        assert match is not None
        secret = match.group(1)
        assert (await cp.client.get("/account", headers=bearer(secret))).status_code == 200
        assert "max-age=0" in shown.headers.get("set-cookie", "").lower()  # deleted as shown
        # The secret came in the cookie, not from any server's memory: the cookie opens to it.
        secret_key = SERVER_SECRET.encode()
        session = decode_session(
            cp.client.cookies.get(SESSION_COOKIE), derive_key(secret_key, "session")
        )
        assert session is not None
        token = shown_path.rsplit("/", 1)[1]
        carried = unseal(
            cp.client.cookies.get(COOKIE_PREFIX + token),
            key=derive_key(secret_key, "reveal"),
            sid=session.sid,
            token=token,
        )
        assert carried is not None and carried.secret == secret
        again = await second.get(shown_path)
        assert again.status_code == 410 and secret not in again.text
