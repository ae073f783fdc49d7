.PHONY: test test-long services stop quickstart bench

# Installs and starts every service the tests need, then runs gofmt, go vet,
# govulncheck and go test -race over the whole module (docs/development.md).
test:
	scripts/test.sh

# The long tier: make test with the long fault matrix (30 s faults, every
# cell), the full exactly-once matrix and the soaks (1M events). Hours, not
# minutes; see docs/development.md.
test-long:
	TXOUTBOX_LONG=1 scripts/test.sh

services:
	scripts/services.sh start

stop:
	scripts/services.sh stop

quickstart:
	go run ./examples/quickstart

# Prints the performance table against the PostgreSQL that `make services`
# starts, and writes it to docs/benchmarks.md and the README's comparison
# (see docs/performance.md).
bench: services
	. .services/env && go run ./bench -markdown docs/benchmarks.md -readme README.md
