# expect: base image 'debian:latest' is not a pinned Debian 12
FROM debian:latest AS build
RUN ./scripts/install-deps.sh && cmake --install /tmp/build --prefix /opt/kolos
FROM debian:12.11-slim
COPY --from=build /opt/kolos /opt/kolos
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd
LABEL org.opencontainers.image.version="0.1.0"
