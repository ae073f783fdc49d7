package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The gate lets one request at a time through, passes bodies on intact,
// and lets a long poll by.
func TestGateSerialisesRequests(t *testing.T) {
	t.Parallel()
	var inside, most atomic.Int32
	release := make(chan struct{})
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "WaitTimeSeconds") {
			<-release // a long poll, held until the test lets it go
			io.WriteString(w, "polled")
			return
		}
		n := inside.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		inside.Add(-1)
		w.Write(body)
	})
	srv := httptest.NewServer(newGate(backend))
	defer srv.Close()

	polled := make(chan string, 1)
	go func() {
		resp, err := http.Post(srv.URL, "application/x-www-form-urlencoded", strings.NewReader("Action=ReceiveMessage&WaitTimeSeconds=20"))
		if err != nil {
			polled <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		polled <- string(b)
	}()

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := "Action=Publish&n=" + strings.Repeat("x", i)
			resp, err := http.Post(srv.URL, "application/x-www-form-urlencoded", strings.NewReader(want))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if got, _ := io.ReadAll(resp.Body); string(got) != want {
				t.Errorf("body %q reached the backend as %q", want, got)
			}
		}()
	}
	wg.Wait() // returns although the long poll is still held: it did not take the gate
	if m := most.Load(); m != 1 {
		t.Errorf("%d requests were inside the backend at once, want 1", m)
	}
	close(release)
	if got := <-polled; got != "polled" {
		t.Errorf("long poll: %q", got)
	}
}
