FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The project is installed from its own files (the build context, trimmed by .dockerignore) as
# a regular package; the sources are not kept in the image.
COPY . /tmp/mixreg-src
RUN pip install '/tmp/mixreg-src[server]' \
    && rm -rf /tmp/mixreg-src \
    && useradd --create-home --home-dir /var/lib/mixreg --shell /usr/sbin/nologin mixreg \
    && install -d -o mixreg -g mixreg -m 700 /var/lib/mixreg/keys

# Not root; the default SQLite database (./mixreg.db) lives in the service user's home, and
# API keys (MIXREG_API_KEYS_FILE) in its keys/ directory, which a volume may hold.
USER mixreg
WORKDIR /var/lib/mixreg
EXPOSE 8000

# Liveness of the API (`mixreg serve`); docker-compose.yml turns it off for the services that
# run other commands of the same image (migrate, worker).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('MIXREG_PORT', '8000') + '/healthz', timeout=4)"]

CMD ["mixreg", "serve", "--host", "0.0.0.0", "--port", "8000"]
