FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY mixreg ./mixreg
COPY models_store ./models_store
COPY migrations ./migrations
COPY service ./service
RUN pip install --no-cache-dir . \
    && useradd --create-home --home-dir /var/lib/mixreg mixreg

# The default SQLite database (./mixreg.db) lives in the service user's home.
USER mixreg
WORKDIR /var/lib/mixreg
EXPOSE 8000
CMD ["mixreg", "serve", "--host", "0.0.0.0", "--port", "8000"]
