# expect: apt-get install without removing /var/lib/apt/lists
FROM debian:12.11-slim AS build
RUN ./scripts/install-deps.sh && cmake --install /tmp/build --prefix /opt/kolos
FROM debian:12.11-slim
COPY --from=build /opt/kolos /opt/kolos
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server && mkdir -p /run/sshd
LABEL org.opencontainers.image.version="0.1.0"
CMD kolos --help
