# syntax=docker/dockerfile:1.7
# One image for both entry points: `skiplock operator` (the chart's Deployment) and `skiplock worker`
# (the Deployments the operator renders from a JobQueue). Build with BuildKit (Docker 23+ default):
#   docker build -t skiplock:0.1.0 .
# Handler images extend it: FROM skiplock:0.1.0, COPY your package to /app (on PYTHONPATH).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- builder: wheels only
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel needs (see .dockerignore): the build backend reads pyproject.toml and README.md.
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY operator ./operator
# Our wheel plus a wheel for every dependency of the operator extra, so the runtime stage installs offline.
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
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
# The wheels are bind-mounted from the builder, never copied: no wheel, compiler or pip cache reaches a layer.
# Bytecode is compiled at install time, so a read-only root filesystem costs nothing at start-up.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels "skiplock[operator]" \
    && groupadd --system --gid 10001 skiplock \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin skiplock \
    && mkdir -p /app \
    && skiplock --help >/dev/null
WORKDIR /app
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
ENTRYPOINT ["skiplock"]
CMD ["--help"]
