# Hearth — build, run, test.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
GO      ?= go
CONFIG  ?= config.yaml

.PHONY: build run demo test test-daemon test-alone test-readside test-deps soak fuzz bench bench-readside lint docker clean

build: ## static binary in bin/hearth (the daemon; the demo is bin/hearth-demo, built by make demo)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/hearth ./cmd/hearth

run: build ## run the daemon on $(CONFIG)
	./bin/hearth run --config $(CONFIG)

demo: build ## self-contained demo: no Redis or PostgreSQL needed
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/hearth-demo ./cmd/hearth-demo
	./bin/hearth demo

# The fuzz targets' seeds and saved failures (testdata/fuzz) run as ordinary
# tests here; fuzzing itself is make fuzz: a 3 s pass per target spent most of
# its time building each package with coverage instrumentation (45 s per
# target, 5 min in all, on a loaded 2-core CI machine) and fuzzed for 21 s.
test: test-deps ## every test, race detector on, against real Redis and PostgreSQL (fuzz seeds included); then the soak for 2m on its own
	$(MAKE) --no-print-directory -j2 test-daemon test-readside
	$(MAKE) --no-print-directory test-alone
	$(MAKE) --no-print-directory soak DURATION=2m

# ALONE are the tests whose subject is the daemon's timing or CPU against the
# wall clock on real servers (a Cluster failover inside a 1-3 s lease,
# connections shed under a flood, the CPU a flood of notifications costs,
# writes landing while a foreign fence is re-planted): run beside the rest of the suite on two cores, the starved
# machine is what they measure. They run after it, one at a time.
ALONE := ^(TestClusterFailoverCostsOnlyItsKeys|TestClusterStaysWarm|TestFailoverGraceFencedByNextLeader|TestIdleConnectionsDoNotStarveProbes|TestNotifyFloodIDsThenAll|TestNotifyFloodOneMember|TestMarkerLookalikeFlood|TestForeignFence)$$

# The daemon's module and the read side's (a module of its own, tested with its
# own go.mod's versions) run side by side: the read side's tests are light.
# -parallel 4: the end-to-end tests marked parallel mostly wait on timers.
test-daemon:
	$(GO) test -race -count=1 -parallel 4 -timeout 14m -skip '$(ALONE)' $$($(GO) list ./... | grep -v '/soak$$')

test-alone:
	$(GO) test -race -count=1 -p 1 -timeout 10m -run '$(ALONE)' ./cmd/hearth/ ./fence/

test-readside:
	cd readside && $(GO) test -race -count=1 -timeout 5m ./...

test-deps: ## find, install (apt-get, as root) and start what the tests need: redis-server, redis-tools, postgresql, prometheus
	@scripts/test-deps

DURATION ?= 10m
SEED     ?=
CLUSTER  ?=
soak: ## nemesis soak (docs/soak.md): three instances through a seeded fault schedule for $(DURATION); SEED=n replays one; CLUSTER=1 on a Redis Cluster; LOGS=dir keeps every instance's log
	SOAK_DURATION=$(DURATION) SOAK_SEED=$(SEED) SOAK_CLUSTER=$(CLUSTER) SOAK_LOGS=$(LOGS) $(GO) test -race -count=1 -timeout 2h -v ./soak/

FUZZTIME ?= 10s
fuzz: ## run each fuzz target for $(FUZZTIME) (one target per go test invocation)
	$(GO) test -run '^$$' -fuzz '^FuzzParseTemplate$$' -fuzztime $(FUZZTIME) ./keytmpl/
	$(GO) test -run '^$$' -fuzz '^FuzzPrewarmClassify$$' -fuzztime $(FUZZTIME) ./prewarm/
	$(GO) test -run '^$$' -fuzz '^FuzzMemberClass$$' -fuzztime $(FUZZTIME) ./keytmpl/
	$(GO) test -run '^$$' -fuzz '^FuzzConfigParse$$' -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run '^$$' -fuzz '^FuzzPointer$$' -fuzztime $(FUZZTIME) ./sources/http/
	$(GO) test -run '^$$' -fuzz '^FuzzParsePayload$$' -fuzztime $(FUZZTIME) ./changes/
	cd readside && $(GO) test -run '^$$' -fuzz '^FuzzOpenStale$$' -fuzztime $(FUZZTIME) ./

bench: ## benchmarks that print figures (see README "Performance")
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/...
	cd bench/readside && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m .

READSIDE_DURATION ?= 5m
bench-readside: ## the read side's origin loads per TTL window over $(READSIDE_DURATION) (default 5m: a short run's count is mostly its edges), against the plain-lock reference, FLUSHDB mid-run
	cd bench/readside && READSIDE_BENCH_DURATION=$(READSIDE_DURATION) $(GO) test -run '^$$' -bench 'Stampede/^(plain_lock.*|readside)$$/flush' -benchtime 1x -timeout 60m .

lint: ## gofmt, go vet, go mod tidy
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) mod tidy -diff
	cd readside && $(GO) vet ./... && $(GO) mod tidy -diff

docker: ## container image (needs a Docker engine)
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t hearth:$(VERSION) .

clean:
	rm -rf bin
