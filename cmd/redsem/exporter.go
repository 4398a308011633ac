//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/exporter"
)

const exporterHelp = `Usage: redsem exporter [flags]

Serves /metrics in the Prometheus text format for every semaphore, mutex,
read-write lock and rate gate under the key prefix (every kind the fleet view
finds), read from Redis at each scrape: one bounded SCAN over the meta keys
and one read-only script per name. The metrics are listed in docs/fleet.md.

  --listen ADDR     address to serve on (default ":9464")
  --limit N         report at most N names per scrape (default 1000)
  --max-scan N      send at most N SCAN calls (COUNT 500) per scrape (default 100);
                    past it redsem_scrape_truncated is 1
  --timeout D       bound on one scrape's Redis reads (default 10s)
  --log-every D     log the same scrape failure at most once per D (default 30s)

` + connHelp + `
A scrape that cannot read Redis serves redsem_scrape_error 1 and logs why on
stderr (Redis unreachable, a refused login, NOPERM on SCAN: allow +scan); a name
whose keys cannot be read is logged too.

Exit codes: 0 stopped by SIGINT/SIGTERM; 64 bad flags or Redis URL;
69 cannot listen, or the sentinels name no master.

Example:
  redsem exporter --listen :9464 --prefix redsem: --redis redis://cache:6379/0
`

// cmdExporter serves the exporter's Collector on --listen until SIGINT or
// SIGTERM. It connects as every other command does (connect): the same
// URLs, TLS flags and errors, a bad URL refused before it listens.
func cmdExporter(args []string, _, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveExporter(ctx, args, stderr)
}

func serveExporter(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlagSet("exporter")
	var c connFlags
	c.register(fs)
	listen := fs.String("listen", ":9464", "")
	limit := fs.Int("limit", admin.DefaultScanLimit, "")
	maxScan := fs.Int("max-scan", admin.DefaultMaxScan, "")
	timeout := durationValue{d: 10 * time.Second}
	fs.Var(&timeout, "timeout", "")
	every := durationValue{d: 30 * time.Second}
	fs.Var(&every, "log-every", "")
	pos, err := parseArgs(fs, args, exporterHelp)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usagef("exporter: no arguments expected, got %q (see redsem exporter --help)", strings.Join(pos, " "))
	case *limit < 1 || *maxScan < 1:
		return usagef("exporter: --limit and --max-scan must be at least 1")
	case timeout.d <= 0 || every.d <= 0:
		return usagef("exporter: --timeout and --log-every must be positive")
	}
	p, err := connect(c)
	if err != nil {
		return err
	}
	defer p.Close()
	logger := log.New(stderr, "redsem: exporter: ", log.LstdFlags)
	col, err := exporter.New(p.main, exporter.Options{Prefix: c.prefix, AllowEmptyPrefix: true,
		Limit: *limit, MaxScan: *maxScan, Timeout: timeout.d, ErrorLog: logger, LogEvery: every.d})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "redsem exporter: metrics at /metrics")
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return exitf(exitUnavailable, "exporter: %v", err)
	}
	logger.Printf("serving http://%s/metrics for prefix %q of %s", ln.Addr(), c.prefix, p.shown)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return exitf(exitUnavailable, "exporter: %v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		logger.Printf("shutdown: %v", err)
	}
	<-done
	return nil
}
