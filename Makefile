# make test   — everything CI runs: installs redis-server (PostgreSQL for examples/inventory and fence/fencetest, MariaDB for fence/fencetest, Chromium for dlock web's browser test) when missing, vet, race tests with leak checks (the library, the dlockprom and dlockotel adapters, the example, dlock web, the bench harness, the checker).
# make bench  — dlock beside its peers (bench/ module, ≤ 6 min); writes docs/BENCHMARKS.md and docs/img/.
# make bench-quick — the same scenarios, shorter (≤ 60 s), printed only.
# make bench-go — the Go benchmarks of the library against a private redis-server.
# make web-screenshot — the picture of dlock web in the README (docs/img/dlock-web.png), from its browser test.
# make release-version V=v0.2.0 — point every submodule's require of the root at the version being released (docs/RELEASING.md).

GO      ?= go
SUDO    := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: test test-lib test-lib-lane test-modules test-adapters deps vet fmt-check bench-go test-examples deps-examples test-web deps-chromium web-screenshot test-fence deps-fence

# Two lanes at once, each printed when it ends, of about the same length: the library's own
# tests, then the example service and the fenced-write drivers; and the other modules (metrics
# and tracing adapters, browser test, bench harness, fault checker). Most of their time is
# spent waiting (leases, timeouts, servers starting), so two lanes fit in about half the time.
test: deps deps-examples deps-fence deps-chromium fmt-check vet big-files
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-lib-lane test-modules

test-lib-lane:
	@$(MAKE) --no-print-directory test-lib
	@$(MAKE) --no-print-directory test-examples
	@$(MAKE) --no-print-directory test-fence

# -p 1: one package's tests at a time. Several tests hold 200-300 ms leases on purpose (as in
# "renewal keeps a 200 ms lease through 2 s of work"); on two cores, packages racing each other
# under -race can starve the renewal loop longer than that.
test-lib: deps
	$(GO) test -race -count=1 -p 1 -timeout 8m ./...
	@$(MAKE) --no-print-directory release-check

test-modules:
	@$(MAKE) --no-print-directory test-adapters
	@$(MAKE) --no-print-directory test-web
	@$(MAKE) --no-print-directory test-bench
	@$(MAKE) --no-print-directory test-check

# The metrics and tracing adapters are modules of their own (dlockprom/: prometheus/client_golang;
# dlockotel/: OpenTelemetry), so their dependencies stay out of the library's. Each starts its
# own redis-server.
test-adapters: deps
	cd dlockprom && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 3m ./...
	cd dlockotel && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 3m ./...

# examples/inventory is its own module (SQLite and PostgreSQL drivers stay out of the library's
# dependencies); its end-to-end tests start redis-server, PostgreSQL and three service replicas.
test-examples: deps deps-examples
	cd examples/inventory && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 6m ./...

# The example's tests run a private PostgreSQL server; install the Debian package when absent
# (the Debian cluster itself is not used).
deps-examples:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
		echo "PostgreSQL missing: installing the Debian package"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	}

# Package fence against real databases: fence/fencetest is its own module (the pgx, SQLite and
# MySQL drivers stay out of the library's dependencies). Its tests start a private PostgreSQL,
# a private MariaDB (on a unix socket) and redis-server, and use SQLite files.
test-fence: deps deps-examples deps-fence
	cd fence/fencetest && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 4m ./...

# fence/fencetest runs a private MariaDB server; install the Debian package when absent (the
# Debian server itself is not used).
deps-fence:
	@command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ] || { \
		echo "MariaDB missing: installing the Debian package"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server; \
	}

# dlock web in a real browser: cmd/dlock/webtest is its own module (chromedp stays out of the
# library's dependencies). Its test builds the command, runs "dlock web" against a private
# redis-server and drives the page from headless Chromium.
test-web: deps deps-chromium
	cd cmd/dlock/webtest && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 3m ./...

# The browser test's screenshot, kept in docs/img/ and shown in the README.
web-screenshot: deps deps-chromium
	cd cmd/dlock/webtest && DLOCK_WEB_SCREENSHOT=$(CURDIR)/docs/img/dlock-web.png $(GO) test -count=1 -run TestBrowser ./...

# The browser test drives Chromium headless; install the Debian package when absent.
deps-chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
		echo "Chromium missing: installing the Debian package"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	}

# Tests start real redis-server processes (never a mock); install the Debian package when absent.
deps:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "redis-server missing: installing the Debian package"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	}
	@redis-server --version

vet:
	$(GO) vet ./...

# The repository stays small and its modules usable from outside: no tracked file over 1 MB
# but an image under docs/, and every published module builds, as a consumer's build sees it
# once tagged, without the in-repo replace directives (internal/releasecheck).
# (release-check runs in the library's test lane: its first run on a machine builds every
# published package's dependencies afresh, about two minutes.)
.PHONY: repo-check big-files release-check release-version
repo-check: big-files release-check
big-files:
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | \
		awk '$$1 > 1048576 && $$2 !~ /^docs\/.*\.(png|jpg|jpeg|gif|svg|webp)$$/ {print $$2 " (" $$1 " bytes)"}'); \
	if [ -n "$$big" ]; then echo "tracked files over 1 MB (only images under docs/ may be):"; echo "$$big"; exit 1; fi
release-check:
	$(GO) run ./internal/releasecheck

release-version:
	@case "$(V)" in v[0-9]*.[0-9]*.[0-9]*) ;; *) echo "usage: make release-version V=vX.Y.Z"; exit 2;; esac
	for m in $$(git ls-files '*go.mod' | grep -v '^go.mod$$'); do \
		sed -i -E 's#^(\s*github.com/dlock-go/dlock(/dlockprom|/dlockotel)?) v[0-9][^ ]*$$#\1 $(V)#' $$m; done
	@grep -n 'github.com/dlock-go/dlock[a-z/]* v' $$(git ls-files '*go.mod')

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench-go: deps
	$(GO) test -run '^$$' -bench . -benchmem -count 3 -benchtime 2s -timeout 20m . | tee bench.out

# The peers comparison: bench/ is its own module, so redsync, redislock, rueidislock and
# the plotting library never enter the library's dependencies. It starts its own redis-servers on loopback.
# bench: the full run (at most 6 minutes); writes the tables into docs/BENCHMARKS.md and the plot into docs/img/.
# bench-quick: every scenario, shorter (at most a minute), printed only.
.PHONY: bench bench-quick test-bench

# The bench harness's own tests (tiny durations), so that it keeps building and working.
test-bench: deps
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 3m ./...

bench-quick: deps
	cd bench && $(GO) run . --quick

bench: deps
	cd bench && $(GO) run . --write-docs --plot ../docs/img --via 'make bench'

# The fault-injection checker: check/ is its own module, so porcupine stays out of the
# library's dependencies. It starts its own redis-servers (standalone, 5 for Redlock, a Sentinel
# group), a resource server and 5 worker processes, all on loopback.
# test-check: its unit and end-to-end tests, then every scenario in both modes, short (CI).
# check-faults: the full run (>= 10,000 register operations per run where time allows; about
# half an hour for its 79 runs); writes the table into docs/CORRECTNESS.md.
.PHONY: test-check check-faults

test-check: deps
	cd check && $(GO) vet ./... && $(GO) test -count=1 -timeout 3m ./... && $(GO) run . --short

check-faults: deps
	cd check && $(GO) run . --seed 1 --write-docs ../docs/CORRECTNESS.md
