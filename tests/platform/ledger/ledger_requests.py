"""The served request the ledger tests record: only the fields an entry is built from."""

from __future__ import annotations

from hydrant.engine.protocol import Sampling
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.quotas.admission import RequestContext


def request_context(request_id: str, tenant_id: str) -> RequestContext:
    """A 3-token prompt with max_tokens 4 on the demo model, by a key-less caller."""
    return RequestContext(
        request_id=request_id,
        tenant_id=tenant_id,
        api_key_id=None,
        key_prefix="hyd_test_x",
        model="demo",
        prepared=PreparedRequest.single([1, 2, 3], Sampling(max_tokens=4)),
    )
