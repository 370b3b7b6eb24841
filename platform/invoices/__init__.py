"""Monthly invoices: drafts computed from the ledger, finalized invoices frozen and numbered."""
