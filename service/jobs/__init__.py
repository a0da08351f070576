"""Fit jobs: submitting them, the one fit path (run_job) and the embedded worker."""
