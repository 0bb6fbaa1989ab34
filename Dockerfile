# cowproxy and the demo's sample application, for docker-compose.yml (no embedded PostgreSQL needed:
# the compose file runs the official postgres image).

# Build stage: the wheel with the fast relay's C extension (proxy/_fastrelay.c) needs a compiler, which the
# runtime image does without.
FROM python:3.12-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY proxy ./proxy
COPY scoring ./scoring
COPY migrations ./migrations
COPY demo ./demo
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && python -c "import proxy._fastrelay" \
    && useradd --system --no-create-home cowproxy
USER cowproxy

# The proxy by default; the compose file also runs the sample application from this image.
EXPOSE 6432 9187 9188 8000
ENTRYPOINT ["cowproxy"]
CMD ["--help"]
