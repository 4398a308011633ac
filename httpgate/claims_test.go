package httpgate

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// What docs/middleware.md promises beyond the main paths, one test each.

// TestHandlerPanicGivesSlotBack: a handler that panics gives its slot back
// (net/http recovers the panic and drops the connection).
func TestHandlerPanicGivesSlotBack(t *testing.T) {
	srv := redistest.Start(t)
	lim, err := New(srv.Pool(t), Config{Name: "api", Limit: Limit{Slots: 1}})
	require.NoError(t, err)
	hs := httptest.NewUnstartedServer(lim.Handler(nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("the handler fails")
	})))
	hs.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's stack
	hs.Start()
	t.Cleanup(hs.Close)
	_, _, _, err = get(ctxT(t, 30*time.Second), http.DefaultClient, hs.URL)
	require.Error(t, err, "the server drops the connection of a panicking handler")
	requireFree(t, srv.Pool(t), "api:", 1)
}

// TestHandlerSlotHeldWhileWaitingForStart: with both halves on, a request
// waiting for its start holds its slot meanwhile; when its client goes
// away it takes nothing, slot or start.
func TestHandlerSlotHeldWhileWaitingForStart(t *testing.T) {
	srv := redistest.Start(t)
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 2, N: 1, Per: time.Minute}, Wait: -1}, nil,
		g.handler(func(*http.Request) {}))
	ctx := ctxT(t, 30*time.Second)
	code, _, _, err := get(ctx, http.DefaultClient, r.srv.URL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "the minute's only start")

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := get(cctx, http.DefaultClient, r.srv.URL)
		errc <- err
	}()
	gate, err := rate.New(srv.Pool(t), "api:", 1, time.Minute)
	require.NoError(t, err)
	eventually(t, func() bool {
		st, err := gate.Status(ctx)
		return err == nil && st.Waiting == 1
	}, "the second request waits for a start")
	sem, err := redsem.NewSemaphore(srv.Pool(t), "api:", 2)
	require.NoError(t, err)
	l, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = sem.TryAcquire(ctx)
	require.ErrorIs(t, err, redsem.ErrNoToken, "the waiting request holds the other slot")
	require.NoError(t, l.Release(ctx))

	cancel()
	require.Error(t, <-errc)
	requireFree(t, srv.Pool(t), "api:", 2)
	eventually(t, func() bool {
		st, err := gate.Status(ctx)
		return err == nil && st.Waiting == 0 && st.Started == 1
	}, "the request that went away took no start")
	assert.Equal(t, int64(1), g.done.Load())
}

// TestRetrySeconds: Retry-After is the gate's figure rounded up to whole
// seconds, and at least 1.
func TestRetrySeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 1, time.Millisecond: 1, time.Second: 1,
		time.Second + time.Millisecond: 2, 1500 * time.Millisecond: 2, 59*time.Second + 1: 60} {
		assert.Equal(t, want, retrySeconds(d), "%v", d)
	}
}

// TestObserversHearFailures: while Redis is unreachable, the observers in
// Options and RateOptions hear each failed acquisition (failing open).
func TestObserversHearFailures(t *testing.T) {
	srv := redistest.Start(t)
	var sems, gates admin.Counters
	var g gauge
	r := newReplica(t, srv, Config{Name: "api", Limit: Limit{Slots: 1}, FailOpen: true,
		Options: []redsem.Option{redsem.WithObserver(&sems)}}, nil, g.handler(func(*http.Request) {}))
	rr := newReplica(t, srv, Config{Name: "rated", Limit: Limit{N: 5, Per: time.Second}, FailOpen: true,
		RateOptions: []rate.Option{rate.WithObserver(&gates)}}, nil, g.handler(func(*http.Request) {}))
	srv.Kill()
	ctx := ctxT(t, 30*time.Second)
	for _, url := range []string{r.srv.URL, rr.srv.URL} {
		code, _, _, err := get(ctx, http.DefaultClient, url)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, code, "served unlimited (FailOpen)")
	}
	assert.Equal(t, int64(1), sems.Snapshot().Failures, "the semaphore's observer")
	assert.Equal(t, int64(1), gates.Snapshot().Failures, "the gate's observer")
}

// TestLimitsAskedOncePerKey: Limits is asked once per key while the key
// stays in memory, and again once MaxKeys dropped it.
func TestLimitsAskedOncePerKey(t *testing.T) {
	srv := redistest.Start(t)
	var asked atomic.Int64
	lim, err := New(srv.Pool(t), Config{Name: "api", Limit: Limit{Slots: 2}, MaxKeys: 1,
		Limits: func(string) Limit { asked.Add(1); return Limit{} }})
	require.NoError(t, err)
	ctx := ctxT(t, 30*time.Second)
	for _, key := range []string{"a", "a", "a", "b", "a"} {
		lease, err := lim.Acquire(ctx, key)
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
	}
	assert.Equal(t, int64(3), asked.Load(), "a once, b once, a again after b pushed it out")
}

// TestAcquireNilLease: Acquire returns a nil lease for a limit without
// Slots, and when it failed open; a nil lease's Release is safe to call.
func TestAcquireNilLease(t *testing.T) {
	srv := redistest.Start(t)
	lim, err := New(srv.Pool(t), Config{Name: "api", Limit: Limit{N: 5, Per: time.Second}})
	require.NoError(t, err)
	open, err := New(srv.Pool(t), Config{Name: "open", Limit: Limit{Slots: 1}, FailOpen: true})
	require.NoError(t, err)
	ctx := ctxT(t, 30*time.Second)
	lease, err := lim.Acquire(ctx, "k")
	require.NoError(t, err)
	require.Nil(t, lease)
	assert.NotPanics(t, func() { _ = lease.Release(ctx) })
	srv.Kill()
	lease, err = open.Acquire(ctx, "k")
	require.NoError(t, err, "failed open")
	require.Nil(t, lease)
}

// TestTransportRedirect: a redirect the client follows is two calls: each
// takes its own start, and the first gives its slot back before the second
// takes one (net/http closes a redirect's body before it follows it), so a
// key of one slot follows redirects; the slot is free afterwards.
func TestTransportRedirect(t *testing.T) {
	srv := redistest.Start(t)
	api := partner(t, nil)
	mux := http.NewServeMux()
	mux.Handle("/moved", http.RedirectHandler(api.URL+"/", http.StatusFound))
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	c := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1, N: 10, Per: time.Minute}})
	ctx := ctxT(t, 30*time.Second)
	code, _, body, err := get(ctx, c, front.URL+"/moved")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "first\nrest\n", body)
	requireFree(t, srv.Pool(t), "out:", 1)
	gate, err := rate.New(srv.Pool(t), "out:", 10, time.Minute)
	require.NoError(t, err)
	st, err := gate.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Started, "one start per hop")
}

// TestTransportFailOpen: with Redis unreachable an outgoing request fails
// with Redis's error (fail closed), or is sent unlimited with FailOpen.
func TestTransportFailOpen(t *testing.T) {
	srv := redistest.Start(t)
	api := partner(t, nil)
	closed := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1, N: 5, Per: time.Second}})
	open := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1, N: 5, Per: time.Second}, FailOpen: true})
	srv.Kill()
	ctx := ctxT(t, 30*time.Second)
	_, _, _, err := get(ctx, closed, api.URL)
	require.Error(t, err)
	var full *FullError
	assert.False(t, errors.As(err, &full), "Redis down is not a full key: %v", err)
	code, _, _, err := get(ctx, open, api.URL)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
}

// TestTransportLostLeaseCancels: an outgoing request whose lease is lost
// while its body is read (here its keys are deleted) has its context
// cancelled: the read fails, with the cause, rather than go on without a
// slot.
func TestTransportLostLeaseCancels(t *testing.T) {
	srv := redistest.Start(t)
	finish := make(chan struct{})
	defer close(finish)
	api := partner(t, finish)
	c := client(t, srv, Config{Name: "out", Limit: Limit{Slots: 1},
		Options: []redsem.Option{redsem.WithTTL(100 * time.Millisecond)}})
	ctx := ctxT(t, 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"?slow=1", nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	srv.Do(t, "FLUSHALL")
	_, err = io.ReadAll(resp.Body)
	require.ErrorIs(t, err, redsem.ErrLeaseLost, "the lease's loss ends the request")
}
