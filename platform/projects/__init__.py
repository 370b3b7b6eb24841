"""Projects: attribution and budgets below the tenant (issue #26)."""
