"""Shared test helpers: tiny models, synthetic and projected stores, live services, subprocess helpers."""
