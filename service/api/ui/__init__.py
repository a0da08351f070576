"""Pictures of fits and the read-only web page."""
