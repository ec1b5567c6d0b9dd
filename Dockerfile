# Hearth: a static binary on distroless, as a non-root user.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
# The read side is a module of its own that the root go.mod replaces with ./readside.
COPY readside/go.mod readside/go.sum ./readside/
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/hearth ./cmd/hearth

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/hearth /hearth
COPY config.yaml /etc/hearth/config.yaml
USER nonroot:nonroot
EXPOSE 9464
# distroless has no shell or curl: the binary is its own probe (exit 0 healthy, 1 not).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/hearth", "healthcheck", "--url", "http://127.0.0.1:9464/healthz"]
ENTRYPOINT ["/hearth"]
CMD ["run", "--config", "/etc/hearth/config.yaml", "--listen", "0.0.0.0:9464"]
