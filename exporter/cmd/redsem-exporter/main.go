// Command redsem-exporter serves Prometheus metrics for every semaphore,
// mutex and rate gate under a redsem key prefix on /metrics. "redsem
// exporter ARGS" runs it with the same arguments.
//
//	redsem-exporter [--listen :9464] [--prefix redsem:] [--redis URL] [--limit 1000] [--max-scan 100] [--timeout 10s]
//
// Install it with
//
//	go install github.com/redsem/redsem/exporter/cmd/redsem-exporter@latest
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/exporter"
)

const help = `Usage: redsem-exporter [flags]     (also: redsem exporter [flags])

Serves /metrics in the Prometheus text format for every semaphore, mutex and
rate gate under the key prefix, read from Redis at each scrape: one bounded
SCAN over the meta keys and one read-only script per name.

  --listen ADDR     address to serve on (default ":9464")
  --prefix P        key prefix to scan (default "redsem:"; "" for none)
  --redis URL       Redis to read; default $REDIS_URL, else redis://127.0.0.1:6379
                    (redis://[[user]:password@]host[:port][/db], rediss:// for TLS)
  --limit N         report at most N names per scrape (default 1000)
  --max-scan N      send at most N SCAN calls (COUNT 500) per scrape (default 100);
                    past it redsem_scrape_truncated is 1
  --timeout D       bound on one scrape's Redis reads (default 10s)

Exit codes: 0 stopped by SIGINT/SIGTERM; 64 bad flags; 69 cannot listen.

Example:
  redsem-exporter --listen :9464 --prefix redsem: --redis redis://cache:6379/0
`

// Exit codes, as the redsem command's.
const (
	exitUsage       = 64
	exitUnavailable = 69
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, serves until ctx ends, and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redsem-exporter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", ":9464", "")
	prefix := fs.String("prefix", redsem.DefaultPrefix, "")
	url := fs.String("redis", "", "")
	limit := fs.Int("limit", admin.DefaultScanLimit, "")
	maxScan := fs.Int("max-scan", admin.DefaultMaxScan, "")
	timeout := fs.Duration("timeout", 10*time.Second, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			return 0
		}
		fmt.Fprintf(stderr, "redsem-exporter: %v (see --help)\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "redsem-exporter: unexpected argument %q (see --help)\n", fs.Arg(0))
		return exitUsage
	}
	if *limit < 1 || *maxScan < 1 || *timeout <= 0 {
		fmt.Fprintln(stderr, "redsem-exporter: --limit, --max-scan and --timeout must be positive")
		return exitUsage
	}
	target := *url
	if target == "" {
		target = os.Getenv("REDIS_URL")
	}
	if target == "" {
		target = "redis://127.0.0.1:6379"
	}
	pool := &redis.Pool{
		MaxIdle:     2,
		IdleTimeout: time.Minute,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialURLContext(ctx, target,
				redis.DialConnectTimeout(5*time.Second),
				redis.DialReadTimeout(*timeout),
				redis.DialWriteTimeout(5*time.Second))
		},
	}
	defer pool.Close()
	col, err := exporter.New(pool, exporter.Options{Prefix: *prefix, AllowEmptyPrefix: true, Limit: *limit, MaxScan: *maxScan, Timeout: *timeout})
	if err != nil {
		fmt.Fprintf(stderr, "redsem-exporter: %v\n", err)
		return exitUsage
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
		fmt.Fprintln(w, `redsem-exporter: metrics at /metrics`)
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "redsem-exporter: %v\n", err)
		return exitUnavailable
	}
	fmt.Fprintf(stderr, "redsem-exporter: serving http://%s/metrics for prefix %q\n", ln.Addr(), *prefix)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		fmt.Fprintf(stderr, "redsem-exporter: %v\n", err)
		return exitUnavailable
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-done
	return 0
}
