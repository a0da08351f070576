"""API keys: their format and storage (``keys``), who may call what (``policy``), and the ASGI
middleware that checks every request (``middleware``)."""
