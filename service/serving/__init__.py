"""Predictions from stored models, on the request path (no database read on a hit)."""
