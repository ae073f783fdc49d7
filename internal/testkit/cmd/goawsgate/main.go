// Command goawsgate fronts the test SNS/SQS emulator (goaws) that
// scripts/services.sh starts: a reverse proxy that lets one request at a
// time through to it.
//
// goaws v0.4.5 (the newest) reads its global topic and queue maps in its
// handlers without taking their locks. Run as its own process that is no
// data race in our tests, but a Publish arriving while another test creates
// a topic can still kill it ("fatal error: concurrent map read and map
// write", gosns.go:500), and every SNS test after that fails. goaws answers
// in well under a millisecond, so serialising its requests costs the tests
// little. A long poll (a request naming WaitTimeSeconds) would hold every
// other request up, so it bypasses the gate; the tests do not long-poll.
package main

import (
	"bytes"
	"flag"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:24100", "address to serve on")
	target := flag.String("target", "http://127.0.0.1:24101", "goaws' URL")
	flag.Parse()
	u, err := url.Parse(*target)
	if err != nil {
		log.Fatalf("goawsgate: -target: %v", err)
	}
	log.Fatal(http.ListenAndServe(*listen, newGate(httputil.NewSingleHostReverseProxy(u))))
}

// newGate serves next one request at a time, long polls aside.
func newGate(next http.Handler) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "goawsgate: read request: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte("WaitTimeSeconds")) {
			mu.Lock()
			defer mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}
