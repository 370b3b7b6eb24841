"""Tenants and their plans: who may call, within which limits, budgets and models."""
