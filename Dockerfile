# syntax=docker/dockerfile:1
# One image, three services: `docker run IMAGE palimpsest.store` (or palimpsest.compressor,
# palimpsest.agent; the default). Kubernetes picks one with `args` (deploy/base).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the package and its dependencies into /opt/venv (wheels only, no compiler needed) ---
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY palimpsest ./palimpsest
# Not an editable install: the runtime stage gets /opt/venv alone, never the source tree.
# The Ollama simulator (tests, `make demo`, benchmarks) is left out by .dockerignore.
RUN /opt/venv/bin/pip install --no-cache-dir . \
    && /opt/venv/bin/pip uninstall --yes --quiet pip setuptools

# --- runtime: the venv, a non-root user, nothing else ---
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="palimpsest" \
      org.opencontainers.image.description="Palimpsest: SessionStore, Compressor and Agent gRPC services"
# bubblewrap: run_command's sandbox (README, Commands' sandbox). Not pinned: Debian's security
# updates of it are wanted at every build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# A numeric user, so Kubernetes' runAsNonRoot can check it; /data is the only place written
# (PALIMPSEST_DATA_DIR: the Compressor's tokenizers, session files unless PALIMPSEST_FILES_ROOT
# points elsewhere, share.key only when PALIMPSEST_SHARE_KEY is unset).
RUN groupadd --system --gid 10001 palimpsest \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin palimpsest \
    && mkdir -p /data \
    && chown 10001:10001 /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/data \
    PALIMPSEST_DATA_DIR=/data \
    PALIMPSEST_STORE_ADDR=0.0.0.0:50051 \
    PALIMPSEST_COMPRESSOR_LISTEN=0.0.0.0:50052 \
    PALIMPSEST_AGENT_ADDR=0.0.0.0:50053
WORKDIR /data
USER 10001:10001
# SessionStore, Compressor, Agent (gRPC, each with grpc.health.v1 and reflection).
EXPOSE 50051 50052 50053
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m"]
CMD ["palimpsest.agent"]
