"""Uploaded data: parsing every accepted format and storing datasets."""
