.PHONY: test services stop quickstart bench

# Installs and starts PostgreSQL, RabbitMQ and the SNS emulator, then runs
# gofmt, go vet and go test -race over the whole module.
test:
	scripts/test.sh

services:
	scripts/services.sh start

stop:
	scripts/services.sh stop

quickstart:
	go run ./examples/quickstart

# Prints the performance table against the PostgreSQL that `make services`
# starts (see docs/performance.md).
bench: services
	. .services/env && go run ./bench
