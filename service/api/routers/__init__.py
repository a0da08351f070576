"""One router per resource; each is thin and calls plain functions."""
