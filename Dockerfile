# syntax=docker/dockerfile:1.7
# Two images from one file, both running the `skiplock` CLI as a numeric non-root user. Build with BuildKit
# (Docker 23+ default):
#   docker build -t skiplock:0.1.0 .                                 # the full image (the last stage, `operator`):
#                                                                    # `skiplock operator`, `skiplock worker` and
#                                                                    # `skiplock ui` (the `ui` extra)
#   docker build --target worker -t skiplock-worker:0.1.0 .          # workers only: no kopf, no Kubernetes client
# Handler images extend either: FROM skiplock-worker:0.1.0, COPY your package to /app (on PYTHONPATH).
#
# Supply chain: every third-party wheel is pinned with its sha256 in requirements/*.lock (`make lock`) and
# installed with --require-hashes, so a changed file on the index fails the build. The base image is named by
# tag; pin it by digest for a reproducible build (the digest is what the registry reports for the tag):
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- builder: wheels only
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The locks first: the dependency layer is rebuilt only when a lock changes.
COPY requirements ./requirements
# Every locked wheel, each checked against its hash on download. Binary wheels only: a wheel built here from a
# source archive would have a hash of its own, which no lock can know.
RUN python -m pip download --no-cache-dir --require-hashes --no-deps --only-binary=:all: --dest /wheels \
        -r requirements/operator.lock \
    && cp requirements/worker.lock requirements/operator.lock /wheels/
# Only what our wheel needs (see .dockerignore): the build backend reads pyproject.toml and README.md.
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY operator ./operator
# Our own wheel, built here from this source: the one unhashed file, installed with --no-deps.
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------- runtime: what both images share
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="skiplock" \
      org.opencontainers.image.description="Kubernetes-native job queue inside PostgreSQL: worker and operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/skiplock/skiplock" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app
RUN groupadd --system --gid 10001 skiplock \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin skiplock \
    && mkdir -p /app
WORKDIR /app
ENTRYPOINT ["skiplock"]
CMD ["--help"]

# ---------------------------------------------------------------- worker: `skiplock worker` only
# The wheels are bind-mounted from the builder, never copied: no wheel, compiler or pip cache reaches a layer.
# Bytecode is compiled at install time, so a read-only root filesystem costs nothing at start-up.
FROM runtime AS worker
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels --require-hashes --no-deps \
        -r /wheels/worker.lock \
    && python -m pip install --no-cache-dir --no-index --find-links=/wheels --no-deps "skiplock" \
    && python -m pip check \
    && skiplock --help >/dev/null
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001

# ---------------------------------------------------------------- operator (default): every entry point, the UI too
FROM runtime AS operator
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels --require-hashes --no-deps \
        -r /wheels/operator.lock \
    && python -m pip install --no-cache-dir --no-index --find-links=/wheels --no-deps "skiplock[operator,ui]" \
    && python -m pip check \
    && skiplock --help >/dev/null \
    && skiplock ui --help >/dev/null \
    && python -c "import kopf, kubernetes, skiplock_operator, skiplock.ui"
USER 10001:10001
