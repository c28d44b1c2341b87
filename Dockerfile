# rekey's container image, for those who build with Docker (or podman/buildah):
#   docker build -t rekey:0.1.0 .
#   docker run --rm rekey:0.1.0 --version
# scripts/image builds the same image without Docker or a registry.
#
# Build stage: the release binary (rustls; no OpenSSL), from the lock file.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin rekey \
 && install -D -m 0755 target/release/rekey /out/rekey

# Runtime: glibc and the CA certificates, an unprivileged user, nothing else.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 rekey \
 && useradd --uid 10001 --gid 10001 --home-dir /home/rekey --create-home \
      --shell /usr/sbin/nologin rekey
COPY --from=build /out/rekey /usr/local/bin/rekey
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
WORKDIR /home/rekey
ENTRYPOINT ["rekey"]
