// Command pgbouncergate fronts the tests' shared PgBouncer that
// scripts/services.sh starts, keeping cancel requests from it
// (internal/testkit/cancelgate says why).
package main

import (
	"flag"
	"log"
	"net"

	"github.com/txoutbox/txoutbox/internal/testkit/cancelgate"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:24434", "address to serve on")
	target := flag.String("target", "127.0.0.1:24435", "PgBouncer's address")
	flag.Parse()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("pgbouncergate: %v", err)
	}
	log.Fatal(cancelgate.Serve(l, *target, log.Default()))
}
