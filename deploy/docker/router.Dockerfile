# syntax=docker/dockerfile:1
# kvserve router image (slim Debian, CPU only). Build from the repository root:
#   docker build -f deploy/docker/router.Dockerfile -t kvserve-router .
# The same `kvserve` binary as the worker image, without the CUDA backend: the router tokenizes
# and routes, it runs no model.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
ARG BUILD_JOBS=
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN apt-get update -qq && /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No nvcc in this stage, so CMake builds no CUDA backend.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DKVSERVE_BUILD_TESTS=OFF -DKVSERVE_BUILD_BENCH=OFF \
    && cmake --build build --target kvserve --parallel ${BUILD_JOBS:-$(nproc)} \
    && deploy/docker/collect-runtime.sh build /out

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/packages /tmp/runtime-packages
RUN apt-get update -qq \
    && xargs -r apt-get install -y -qq --no-install-recommends </tmp/runtime-packages \
    && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages
RUN groupadd --system --gid 10001 kvserve \
    && useradd --system --uid 10001 --gid kvserve --home-dir /home/kvserve --create-home \
         --shell /usr/sbin/nologin kvserve
COPY --from=build /out/bin/kvserve /opt/kvserve/bin/kvserve
RUN ln -s /opt/kvserve/bin/kvserve /usr/local/bin/kvserve
USER 10001:10001
WORKDIR /home/kvserve
# gRPC, OpenAI-compatible HTTP, metrics.
EXPOSE 50051 8000 9090
ENTRYPOINT ["kvserve"]
CMD ["router", "--help"]
