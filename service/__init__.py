"""The mixreg HTTP service: fit mixtures of linear regressions in jobs, serve predictions."""
