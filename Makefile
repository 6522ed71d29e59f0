# rl-tproxy build, test and demo entry points. Every target that needs a tool
# installs it first (Debian packages via apt-get when running as root, Go
# tools through the module proxy), so a fresh Linux machine needs only Go.
SHELL := /bin/bash
GO ?= go
BIN := bin/rl-tproxy
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
FUZZTIME ?= 20000x
# make fuzz: the long run, this long per target; FUZZ (a regexp) picks targets.
LONGFUZZTIME ?= 5m
FUZZ ?= .
# Test binaries run at once by test-unit. Most packages' tests wait on child
# processes, sockets and timers rather than the CPU, so more than the
# default (one per CPU) keeps two cores busy.
TESTP ?= 4
# The packages whose tests take longest, named first so that they start
# first instead of last (go test starts packages in the order given); ./...
# after them still runs every package, each once.
SLOWPKGS := ./test/e2e ./pkg/hook ./pkg/h2proxy ./test/steer ./pkg/proxy ./test/fault ./pkg/evloop

.PHONY: all build generate generate-check test test-unit test-alloc test-fuzz fuzz lint deps demo bench soak clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rl-tproxy

# Rebuild the committed eBPF objects and Go bindings with the pinned
# clang-14 (bpf/doc.go; `make deps` installs it).
generate: deps
	$(GO) generate ./bpf/...

# CI guard: the committed eBPF objects must match what `make generate`
# produces. The compiler is pinned (clang-14), so the comparison is exact
# whatever other clang the machine has as `clang`.
generate-check: generate
	@git diff --exit-code --stat -- bpf/ || { echo "bpf/: committed objects are stale: run 'make generate' and commit"; exit 1; }

# Debian packages and tools the test suite and demo use (no-op when present).
deps:
	@test/deps.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

test-unit:
	$(GO) test -race -count=1 -p $(TESTP) -timeout 40m $(SLOWPKGS) ./...

# The allocation tests (files tagged //go:build !race) without -race.
test-alloc:
	@test/allocs.sh

# Short runs of every fuzz target beyond its committed seed corpus.
test-fuzz:
	@test/fuzz.sh $(FUZZTIME)

# Long fuzzing, not part of make test: every target (or those FUZZ matches)
# for LONGFUZZTIME each, e.g. make fuzz LONGFUZZTIME=30m FUZZ=FuzzRequest.
fuzz:
	@test/fuzz.sh $(LONGFUZZTIME) '$(FUZZ)'

test: deps generate-check lint test-unit test-alloc test-fuzz

demo: build
	$(BIN) demo --policy examples/policy.yaml

bench: deps build
	test/bench/run.sh
	test/bench/latency.sh
	test/bench/h2.sh
	test/bench/bigbody.sh
	test/bench/upload.sh
	test/bench/rlclient.sh
	test/bench/sizing.sh
	test/bench/simulate.sh 1000000 $(BIN)

# The long fault run of docs/reliability.md: 1M requests with random client
# aborts; goroutines and fds must return to baseline.
soak: build
	RL_FAULT_N=1000000 $(GO) test -count=1 -v -timeout 60m -run TestRandomClientAborts ./test/fault/

clean:
	rm -rf bin
