package exporter

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// scrape serves col on /metrics as redsem-exporter does, fetches it and
// parses the text the way Prometheus would.
func scrape(t *testing.T, col prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(col))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// value returns the value of the family's series with the given kind and
// name labels, and whether there is one.
func value(fams map[string]*dto.MetricFamily, family, kind, name string) (float64, bool) {
	f := fams[family]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["kind"] != kind || labels["name"] != name {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), true
		default:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func newCollector(t *testing.T, pool redsem.Pool, o Options) *Collector {
	t.Helper()
	col, err := New(pool, o)
	require.NoError(t, err)
	return col
}

// What /metrics serves for a fleet of a busy semaphore (one lease expired,
// a forged token on its list), an idle one, a locked mutex, a rate gate and
// a name whose meta key has the wrong type, on a real redis-server.
func TestMetricsOfAFleet(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const prefix = "exp:"

	enc, err := redsem.NewSemaphore(pool, "encoders", 4, redsem.WithPrefix(prefix))
	require.NoError(t, err)
	var leases []*redsem.Lease
	for i := 0; i < 3; i++ {
		l, err := enc.TryAcquire(ctx)
		require.NoError(t, err)
		leases = append(leases, l)
	}
	srv.Do(t, "ZADD", prefix+"{encoders}:leases", "XX", time.Now().Add(-time.Minute).UnixMilli(), leases[0].Token())
	srv.Do(t, "RPUSH", prefix+"{encoders}:tokens", "forged")

	idle, err := redsem.NewSemaphore(pool, "idle", 2, redsem.WithPrefix(prefix))
	require.NoError(t, err)
	l, err := idle.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))

	mu, err := redsem.NewMutex(pool, "nightly backup", redsem.WithPrefix(prefix))
	require.NoError(t, err)
	_, err = mu.TryLock(ctx)
	require.NoError(t, err)

	gate, err := rate.New(pool, "partner-api", 10, time.Minute, rate.WithPrefix(prefix))
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		_, err := gate.Allow(ctx)
		require.NoError(t, err)
	}
	// A gate whose starts have all come back (their tokens not yet put back
	// on the list) can start again: they count as available.
	burst, err := rate.New(pool, "burst", 2, 20*time.Millisecond, rate.WithPrefix(prefix))
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		_, err := burst.Allow(ctx)
		require.NoError(t, err)
	}
	sched, err := redsem.NewElection(pool, "scheduler", redsem.WithPrefix(prefix))
	require.NoError(t, err)
	lead, err := sched.Campaign(ctx, "host-a")
	require.NoError(t, err)
	defer lead.Resign(ctx)
	srv.Do(t, "SET", prefix+"{broken}:meta", "a string")
	// Another prefix is not reported.
	other, err := redsem.NewSemaphore(pool, "elsewhere", 1)
	require.NoError(t, err)
	_, err = other.TryAcquire(ctx)
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond) // the oldest hold measurably old, burst's starts back

	fams := scrape(t, newCollector(t, pool, Options{Prefix: prefix}))

	const sem, rate = "semaphore", "rate"
	for _, c := range []struct {
		family, kind, name string
		want               float64
	}{
		{"redsem_size", sem, "encoders", 4},
		{"redsem_holders", sem, "encoders", 3},
		{"redsem_available", sem, "encoders", 1},
		{"redsem_waiting", sem, "encoders", 0},
		{"redsem_withheld", sem, "encoders", 0},
		{"redsem_stray_tokens", sem, "encoders", 1},
		{"redsem_rejected_tokens_total", sem, "encoders", 0},
		{"redsem_expired_leases", sem, "encoders", 1},
		{"redsem_size", sem, "idle", 2},
		{"redsem_holders", sem, "idle", 0},
		{"redsem_available", sem, "idle", 2},
		{"redsem_oldest_holder_age_seconds", sem, "idle", 0},
		{"redsem_size", sem, "nightly backup", 1},
		{"redsem_holders", sem, "nightly backup", 1},
		{"redsem_rate_limit", rate, "partner-api", 10},
		{"redsem_rate_interval_seconds", rate, "partner-api", 60},
		{"redsem_rate_window_starts", rate, "partner-api", 4},
		{"redsem_available", rate, "partner-api", 6},
		{"redsem_waiting", rate, "partner-api", 0},
		{"redsem_stray_tokens", rate, "partner-api", 0},
		{"redsem_rejected_tokens_total", rate, "partner-api", 0},
		{"redsem_scrape_error", "", "", 0},
		{"redsem_rate_window_starts", rate, "burst", 0},
		{"redsem_available", rate, "burst", 2},
		{"redsem_holders", "election", "scheduler", 1},
		{"redsem_waiting", "election", "scheduler", 0},
		{"redsem_election_term", "election", "scheduler", float64(lead.Term())},
		{"redsem_election_observers", "election", "scheduler", 0},
		{"redsem_scrape_names", "", "", 6},
		{"redsem_scrape_failed_names", "", "", 1},
		{"redsem_scrape_truncated", "", "", 0},
	} {
		got, ok := value(fams, c.family, c.kind, c.name)
		if assert.True(t, ok, "%s{kind=%q,name=%q} missing", c.family, c.kind, c.name) {
			assert.Equal(t, c.want, got, "%s{kind=%q,name=%q}", c.family, c.kind, c.name)
		}
	}
	age, ok := value(fams, "redsem_oldest_holder_age_seconds", sem, "encoders")
	require.True(t, ok)
	assert.GreaterOrEqual(t, age, 0.02)
	assert.Less(t, age, 60.0)
	_, ok = value(fams, "redsem_size", sem, "elsewhere")
	assert.False(t, ok, "a name under another prefix")
	_, ok = value(fams, "redsem_size", sem, "broken")
	assert.False(t, ok, "an unreadable name")
	assert.Equal(t, dto.MetricType_COUNTER, fams["redsem_rejected_tokens_total"].GetType())
	assert.Equal(t, dto.MetricType_GAUGE, fams["redsem_holders"].GetType())

	// The rejected counter counts the forged token once clients have
	// popped their way past it (the first also reclaims the expired lease).
	for i := 0; i < 3; i++ {
		_, err = enc.TryAcquire(ctx)
		if err != nil {
			require.ErrorIs(t, err, redsem.ErrNoToken)
		}
	}
	fams = scrape(t, newCollector(t, pool, Options{Prefix: prefix}))
	got, _ := value(fams, "redsem_rejected_tokens_total", sem, "encoders")
	assert.Equal(t, 1.0, got)
	got, _ = value(fams, "redsem_stray_tokens", sem, "encoders")
	assert.Equal(t, 0.0, got)
}

// The cap on names holds and says so; an unreachable Redis is a scrape
// error, not a failed HTTP request.
func TestMetricsLimitAndScrapeError(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{"a", "b", "c"} {
		s, err := redsem.NewSemaphore(pool, name, 1)
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.NoError(t, err)
	}
	fams := scrape(t, newCollector(t, pool, Options{Limit: 2}))
	got, _ := value(fams, "redsem_scrape_names", "", "")
	assert.Equal(t, 2.0, got)
	got, _ = value(fams, "redsem_scrape_truncated", "", "")
	assert.Equal(t, 1.0, got)
	assert.Len(t, fams["redsem_size"].GetMetric(), 2)

	dead := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", "127.0.0.1:1") }}
	defer dead.Close()
	fams = scrape(t, newCollector(t, dead, Options{}))
	got, ok := value(fams, "redsem_scrape_error", "", "")
	require.True(t, ok)
	assert.Equal(t, 1.0, got)
	assert.Nil(t, fams["redsem_size"], "no per-name metric without Redis")
}

// The metric names, help texts and units pass Prometheus's own linter.
func TestMetricsLint(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	s, err := redsem.NewSemaphore(pool, "lint", 1)
	require.NoError(t, err)
	_, err = s.TryAcquire(context.Background())
	require.NoError(t, err)
	g, err := rate.New(pool, "lint", 1, time.Second)
	require.NoError(t, err)
	_, err = g.Allow(context.Background())
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(newCollector(t, pool, Options{}))
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestNewRejectsBadOptions(t *testing.T) {
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", "127.0.0.1:1") }}
	defer pool.Close()
	for _, o := range []Options{{Prefix: "a{"}, {Limit: -1}, {MaxScan: -1}, {Timeout: -time.Second}} {
		_, err := New(pool, o)
		assert.ErrorIs(t, err, redsem.ErrInvalidOption, "%+v", o)
	}
	_, err := New(nil, Options{})
	assert.ErrorIs(t, err, redsem.ErrInvalidOption)
}

// One scrape on a large keyspace where few keys are redsem's sends at most
// MaxScan SCAN calls (DefaultMaxScan by default) and one EVALSHA per name,
// and reports redsem_scrape_truncated when the cap cut the scan short.
// Counted by the server (INFO commandstats).
func TestScrapeBoundsTheScan(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range []string{"a", "b", "c"} {
		s, err := redsem.NewSemaphore(pool, name, 1, redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.NoError(t, err)
	}
	// 150,000 keys of another program: 300 SCAN calls of COUNT 500 to walk.
	srv.Do(t, "DEBUG", "POPULATE", 150000, "other")
	scrape(t, newCollector(t, pool, Options{})) // loads the status script

	for _, c := range []struct {
		maxScan   int
		scans     int // exactly; 0: more than DefaultMaxScan, less than maxScan
		truncated float64
	}{{0, admin.DefaultMaxScan, 1}, {17, 17, 1}, {2000, 0, 0}} {
		srv.Do(t, "CONFIG", "RESETSTAT")
		fams := scrape(t, newCollector(t, pool, Options{MaxScan: c.maxScan}))
		calls := srv.CommandCalls(t)
		if c.scans > 0 {
			assert.Equal(t, c.scans, calls["scan"], "max scan %d: %v", c.maxScan, calls)
		} else {
			assert.Greater(t, calls["scan"], admin.DefaultMaxScan, "max scan %d: %v", c.maxScan, calls)
			assert.Less(t, calls["scan"], c.maxScan, "max scan %d: %v", c.maxScan, calls)
		}
		names, _ := value(fams, "redsem_scrape_names", "", "")
		assert.Equal(t, int(names), calls["evalsha"], "one EVALSHA per name, max scan %d: %v", c.maxScan, calls)
		got, _ := value(fams, "redsem_scrape_truncated", "", "")
		assert.Equal(t, c.truncated, got, "max scan %d", c.maxScan)
		if c.truncated == 0 {
			assert.Equal(t, 3.0, names)
		}
	}
}
