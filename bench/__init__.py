"""Benchmarks of mixreg: algorithm quality and speed against a plain reference, and scale."""
