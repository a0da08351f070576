# Two stages: the project is built and installed into a virtual environment in the first, and
# only that environment is copied into the second, so no layer of the image holds the sources.
# Both stages start from the same base image, pinned by digest (a tag can move); `make
# image-digests` prints the digests the tags point at today, to move the pins on purpose.
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7 AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/mixreg
# Every wheel the server runs, each checked against its sha256 in requirements-image.lock
# (requirements.lock's versions; `make lock` writes both): a file that differs is refused.
COPY requirements-image.lock /tmp/requirements-image.lock
RUN /opt/mixreg/bin/pip install --require-hashes --no-deps --only-binary :all: \
        --requirement /tmp/requirements-image.lock
# The project itself, built with the setuptools just installed and nothing downloaded; then
# pip check proves the locked wheels are all it needs. The build context is trimmed by
# .dockerignore.
COPY . /src
RUN /opt/mixreg/bin/pip install --no-deps --no-index --no-build-isolation /src \
    && /opt/mixreg/bin/pip check

FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/mixreg/bin:$PATH \
    MIXREG_PORT=8000

COPY --from=build /opt/mixreg /opt/mixreg
RUN useradd --create-home --home-dir /var/lib/mixreg --shell /usr/sbin/nologin mixreg \
    && install -d -o mixreg -g mixreg -m 700 /var/lib/mixreg/keys

# Not root; the default SQLite database (./mixreg.db) lives in the service user's home, and
# API keys (MIXREG_API_KEYS_FILE) in its keys/ directory, which a volume may hold.
USER mixreg
WORKDIR /var/lib/mixreg
EXPOSE 8000

# Liveness of the API (`mixreg serve`), on the port it serves: both read MIXREG_PORT.
# docker-compose.yml turns it off for the services that run other commands of the same image
# (migrate, worker).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['MIXREG_PORT'] + '/healthz', timeout=4)"]

# `mixreg serve` binds MIXREG_PORT when no --port is given.
CMD ["mixreg", "serve", "--host", "0.0.0.0"]
