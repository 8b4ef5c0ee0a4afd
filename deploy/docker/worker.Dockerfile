# syntax=docker/dockerfile:1
# kvserve worker image. Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t kvserve-worker .
#   docker build -f deploy/docker/worker.Dockerfile --build-arg WITH_CUDA=0 -t kvserve-worker:cpu .
# WITH_CUDA=1 (default) builds the CUDA backend (sm_80, sm_90) with NVIDIA's CUDA packages for
# Debian 12 and ships its runtime libraries (cudart, cuBLAS, NCCL). The backend is loaded at run
# time: without a GPU or driver the same image runs the CPU kernels. The driver itself (libcuda)
# comes from the node through the NVIDIA container runtime, as with every CUDA image.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
ARG WITH_CUDA=1
ARG CUDA_VERSION=13-0
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
ARG BUILD_JOBS=
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The build dependencies, from the same list developers and CI use.
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates curl \
    && /tmp/install-deps.sh \
    && rm -rf /var/lib/apt/lists/*
RUN if [ "$WITH_CUDA" = 1 ]; then \
      curl -fsSL -o /tmp/cuda-keyring.deb "$CUDA_REPO/cuda-keyring_1.1-1_all.deb" \
      && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
      && apt-get update -qq \
      && apt-get install -y -qq --no-install-recommends \
           "cuda-minimal-build-$CUDA_VERSION" "libcublas-dev-$CUDA_VERSION" libnccl-dev \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
COPY . .
# No GPU in the build: name the architectures (A100, H100/H200) instead of "native".
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DKVSERVE_BUILD_TESTS=OFF -DKVSERVE_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    && cmake --build build --parallel ${BUILD_JOBS:-$(nproc)} \
    && deploy/docker/collect-runtime.sh build /out

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG WITH_CUDA=1
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /out/packages /tmp/runtime-packages
# The shared libraries kvserve links, by Debian package (and NVIDIA's, for the CUDA libraries).
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends ca-certificates curl \
    && if [ "$WITH_CUDA" = 1 ]; then \
         curl -fsSL -o /tmp/cuda-keyring.deb "$CUDA_REPO/cuda-keyring_1.1-1_all.deb" \
         && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb && apt-get update -qq; \
       fi \
    && xargs -r apt-get install -y -qq --no-install-recommends </tmp/runtime-packages \
    && apt-get purge -y -qq curl && apt-get autoremove -y -qq \
    && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages
RUN groupadd --system --gid 10001 kvserve \
    && useradd --system --uid 10001 --gid kvserve --home-dir /home/kvserve --create-home \
         --shell /usr/sbin/nologin kvserve
COPY --from=build /out/bin/ /opt/kvserve/bin/
RUN ln -s /opt/kvserve/bin/kvserve /usr/local/bin/kvserve
# The CUDA backend sits beside the binary; LD_LIBRARY_PATH also lets a plain dlopen find it.
ENV LD_LIBRARY_PATH=/opt/kvserve/bin \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /home/kvserve
# gRPC, metrics.
EXPOSE 50051 9090
ENTRYPOINT ["kvserve"]
CMD ["worker", "--help"]
