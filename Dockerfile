# cowproxy and the demo's sample application, for docker-compose.yml (no embedded PostgreSQL needed:
# the compose file runs the official postgres image).
FROM python:3.12-slim

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY proxy ./proxy
COPY scoring ./scoring
COPY migrations ./migrations
COPY demo ./demo
RUN pip install --no-cache-dir . \
    && useradd --system --no-create-home cowproxy
USER cowproxy

# The proxy by default; the compose file also runs the sample application from this image.
EXPOSE 6432 9187 9188 8000
ENTRYPOINT ["cowproxy"]
CMD ["--help"]
