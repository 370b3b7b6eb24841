"""Prepaid credits: grants per tenant, the balance, and paying ledger entries from them."""
