# expect: 1 stage\(s\): expected a multi-stage build
FROM debian:12.11-slim
COPY . /src
RUN /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
CMD ["/opt/kolos/bin/kolos"]
