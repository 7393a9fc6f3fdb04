# Multi-stage build: a static (musl) binary in a distroless image, running as non-root.
#   docker build -t ghcr.io/example/etcd-webhook:0.1.0 .
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev build-base
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Declared targets must exist for cargo to read the manifest (the floor binary and benches).
COPY benches ./benches
RUN cargo build --release --locked --bin etcd-webhook \
 && cp target/release/etcd-webhook /etcd-webhook

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /etcd-webhook /etcd-webhook
USER 65532:65532
EXPOSE 8443 8081
ENTRYPOINT ["/etcd-webhook"]
CMD ["serve"]
