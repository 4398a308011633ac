package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redsem/redsem/httpgate"
)

// BenchmarkHTTPGate is one request at a time through an httptest server,
// keep-alive, to a handler that writes "ok": bare, and behind
// httpgate.Limiter.Handler with a slot, a rate start, or both per request.
// The difference is the middleware's cost per request.
func BenchmarkHTTPGate(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	for _, bc := range []struct {
		name  string
		limit httpgate.Limit
	}{
		{"bare", httpgate.Limit{}},
		{"Slots", httpgate.Limit{Slots: 100}},
		{"Rate", httpgate.Limit{N: 1_000_000_000, Per: time.Second}},
		{"Slots+Rate", httpgate.Limit{Slots: 100, N: 1_000_000_000, Per: time.Second}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := &counters{}
			p := newRedigoPool(benchEnv.addr, c, false)
			defer p.Close()
			h := http.Handler(ok)
			if bc.limit != (httpgate.Limit{}) {
				lim, err := httpgate.New(p, httpgate.Config{Name: benchEnv.key("httpgate", bc.name), Limit: bc.limit})
				if err != nil {
					b.Fatal(err)
				}
				h = lim.Handler(nil, ok)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			client := srv.Client()
			get := func() {
				resp, err := client.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			get() // connect, create the semaphore, load the scripts
			measure(b, c, func() {
				for b.Loop() {
					get()
				}
			})
		})
	}
}
