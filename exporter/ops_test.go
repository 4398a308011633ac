package exporter

import (
	"bytes"
	"context"
	"log"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
)

// exported are the fields of admin.Fleet that Collect turns into metrics.
var exported = map[string]bool{"Semaphores": true, "RWMutexes": true, "RateGates": true, "Elections": true, "Failed": true, "Truncated": true}

// TestEveryFleetKindExported: every field of admin.Fleet (every kind of
// name ReadFleet returns, and what it says of the scan) is exported. A
// kind added to the fleet fails here until Collect exports it.
func TestEveryFleetKindExported(t *testing.T) {
	ft := reflect.TypeOf(admin.Fleet{})
	for i := 0; i < ft.NumField(); i++ {
		f := ft.Field(i)
		assert.True(t, exported[f.Name], "admin.Fleet.%s (%s) is not exported by the Collector: add its metrics to Collect and to exported", f.Name, f.Type)
	}
}

// syncBuffer is a bytes.Buffer a logger and a test may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

// A failed scrape is logged with its reason, once per LogEvery for the same
// reason, and the next line says how many were held back; a name that
// cannot be read is logged too.
func TestScrapeFailuresLogged(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := ln.Addr().String()
	require.NoError(t, ln.Close())
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", down)
	}}
	defer pool.Close()

	var out syncBuffer
	col := newCollector(t, pool, Options{ErrorLog: log.New(&out, "", 0), LogEvery: 300 * time.Millisecond})
	for i := 0; i < 3; i++ {
		fams := scrape(t, col)
		v, _ := value(fams, "redsem_scrape_error", "", "")
		assert.Equal(t, 1.0, v)
	}
	lines := out.lines()
	require.Len(t, lines, 1, "%q", lines)
	assert.Contains(t, lines[0], `scrape of prefix "redsem:" failed`)
	assert.Contains(t, lines[0], "connection refused")
	time.Sleep(350 * time.Millisecond)
	scrape(t, col)
	lines = out.lines()
	require.Len(t, lines, 2, "%q", lines)
	assert.Contains(t, lines[1], "(and 2 more times since ")

	srv := redistest.Start(t)
	srv.Do(t, "SET", "redsem:{broken}:meta", "a string")
	var out2 syncBuffer
	col = newCollector(t, srv.Pool(t), Options{ErrorLog: log.New(&out2, "", 0)})
	scrape(t, col)
	scrape(t, col)
	lines = out2.lines()
	require.Len(t, lines, 1, "%q", lines)
	assert.Contains(t, lines[0], `cannot read semaphore "broken"`)
	assert.Contains(t, lines[0], "wrong type")

	// Still clean for Prometheus's linter with every kind present.
	problems, err := testutil.CollectAndLint(col)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestScrapeNamesHelpNamesEveryKind: redsem_scrape_names counts every kind
// Collect exports, and its HELP says so.
func TestScrapeNamesHelpNamesEveryKind(t *testing.T) {
	for _, kind := range []string{"semaphores", "mutexes", "read-write locks", "rate gates"} {
		assert.Contains(t, namesDesc.String(), kind)
	}
}
