"""HTTP plumbing shared by every domain: error mapping, request ids."""
