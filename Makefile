# Hearth — build, run, test.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GO      ?= go
CONFIG  ?= config.yaml

.PHONY: build run demo test test-daemon test-readside test-deps soak fuzz bench lint docker clean

build: ## static binary in bin/hearth (the daemon; the demo is bin/hearth-demo, built by make demo)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/hearth ./cmd/hearth

run: build ## run the daemon on $(CONFIG)
	./bin/hearth run --config $(CONFIG)

demo: build ## self-contained demo: no Redis or PostgreSQL needed
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/hearth-demo ./cmd/hearth-demo
	./bin/hearth demo

test: test-deps ## every test, race detector on, against real Redis and PostgreSQL; the soak for 2m on its own; then each fuzzer briefly
	$(MAKE) --no-print-directory -j2 test-daemon test-readside
	$(MAKE) --no-print-directory soak DURATION=2m
	$(MAKE) --no-print-directory fuzz FUZZTIME=3s

# The daemon's module and the read side's (a module of its own, tested with its
# own go.mod's versions) run side by side: the read side's tests are light.
# -parallel 4: the end-to-end tests marked parallel mostly wait on timers.
test-daemon:
	$(GO) test -race -count=1 -parallel 4 -timeout 14m $$($(GO) list ./... | grep -v '/soak$$')

test-readside:
	cd readside && $(GO) test -race -count=1 -timeout 5m ./...

test-deps: ## find, install (apt-get, as root) and start what the tests need: redis-server, redis-tools, postgresql, prometheus
	@scripts/test-deps

DURATION ?= 10m
SEED     ?=
CLUSTER  ?=
soak: ## nemesis soak (docs/soak.md): three instances through a seeded fault schedule for $(DURATION); SEED=n replays one; CLUSTER=1 on a Redis Cluster
	SOAK_DURATION=$(DURATION) SOAK_SEED=$(SEED) SOAK_CLUSTER=$(CLUSTER) $(GO) test -race -count=1 -timeout 2h -v ./soak/

FUZZTIME ?= 10s
fuzz: ## run each fuzz target for $(FUZZTIME) (one target per go test invocation)
	$(GO) test -run '^$$' -fuzz '^FuzzParseTemplate$$' -fuzztime $(FUZZTIME) ./warmer/
	$(GO) test -run '^$$' -fuzz '^FuzzPrewarmClassify$$' -fuzztime $(FUZZTIME) ./prewarm/
	$(GO) test -run '^$$' -fuzz '^FuzzMemberClass$$' -fuzztime $(FUZZTIME) ./warmer/
	$(GO) test -run '^$$' -fuzz '^FuzzConfigParse$$' -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run '^$$' -fuzz '^FuzzPointer$$' -fuzztime $(FUZZTIME) ./sources/http/
	$(GO) test -run '^$$' -fuzz '^FuzzParsePayload$$' -fuzztime $(FUZZTIME) ./changes/
	cd readside && $(GO) test -run '^$$' -fuzz '^FuzzOpenStale$$' -fuzztime $(FUZZTIME) ./

bench: ## benchmarks that print figures (see README "Performance")
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/...
	cd bench/readside && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m .

lint: ## gofmt, go vet, go mod tidy
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) mod tidy -diff
	cd readside && $(GO) vet ./... && $(GO) mod tidy -diff

docker: ## container image (needs a Docker engine)
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t hearth:$(VERSION) .

clean:
	rm -rf bin
