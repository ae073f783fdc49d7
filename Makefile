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
