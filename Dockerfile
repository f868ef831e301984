# ferrum serve in a container.
#
#   docker build -t ferrum .                                    # CPU
#   docker build -t ferrum:cuda --build-arg FEATURES=cuda \
#     --build-arg RUNTIME=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 .   # NVIDIA GPUs
#   docker run -p 8000:8000 -v ferrum-models:/models ferrum serve smollm2
#
# Models are downloaded on first use into /models (a volume: they outlive
# the container). The process is PID 1 and drains on SIGTERM: requests in
# flight finish (up to --shutdown-timeout), new ones get 503.

ARG RUNTIME=debian:bookworm-slim

FROM rust:1-bookworm AS build
ARG FEATURES=""
WORKDIR /src
COPY . .
# The CUDA backend loads its libraries at run time, so it builds without
# the CUDA toolkit; the GPU image's runtime base provides them.
RUN cargo build --release --locked -p ferrum-cli ${FEATURES:+--features $FEATURES} \
 && install -m 0755 target/release/ferrum /usr/local/bin/ferrum

FROM ${RUNTIME}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /home/ferrum --create-home ferrum \
 && mkdir -p /models && chown ferrum:ferrum /models
COPY --from=build /usr/local/bin/ferrum /usr/local/bin/ferrum
USER 10001
# Ferrum's model cache and the Hugging Face cache, both on the volume.
ENV FERRUM_MODELS=/models HF_HOME=/models/huggingface NO_COLOR=1
VOLUME ["/models"]
EXPOSE 8000
# 503 while the model loads, 200 once it serves; the start period covers a
# first download.
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/health || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["ferrum"]
# Every interface, and any Host header: in a container the name clients
# use (a Service, a load balancer) is not known here. Put an API key in
# front of it (FERRUM_API_KEY) where the port is reachable.
CMD ["serve", "smollm2", "--host", "0.0.0.0", "--port", "8000", "--allowed-hosts", "*"]
