package otel

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/httpgate"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

func TestMain(m *testing.M) {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
	goleak.VerifyTestMain(m)
}

// provider records every span ended into the SDK's in-memory exporter.
func provider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// span is what a test checks of a recorded span.
type span struct {
	name, kind, lock, outcome string
	fence                     bool
	status                    codes.Code
}

func summary(s tracetest.SpanStub) span {
	out := span{name: s.Name, status: s.Status.Code}
	for _, kv := range s.Attributes {
		switch kv.Key {
		case KindKey:
			out.kind = kv.Value.AsString()
		case NameKey:
			out.lock = kv.Value.AsString()
		case OutcomeKey:
			out.outcome = kv.Value.AsString()
		case FenceKey:
			out.fence = kv.Value.AsInt64() > 0
		}
	}
	return out
}

// ended returns the spans recorded so far, waiting until there are n (a
// hold's span is recorded on the goroutine that reports the lease's end).
func ended(t *testing.T, exp *tracetest.InMemoryExporter, n int) tracetest.SpanStubs {
	require.Eventually(t, func() bool { return len(exp.GetSpans()) >= n }, 10*time.Second, time.Millisecond)
	return exp.GetSpans()
}

// TestSpans_everyKind: each acquisition of each kind records a wait span
// and, for a lease, a hold span, both children of the caller's span, with
// kind, name, fence and outcome; and the events reach the next Observer.
func TestSpans_everyKind(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	tp, exp := provider(t)
	var counters admin.Counters
	o := New(tp, &counters)
	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")

	sem, err := redsem.NewSemaphore(pool, "encoders", 1, redsem.WithObserver(o))
	require.NoError(t, err)
	mu, err := redsem.NewMutex(pool, "rollup", redsem.WithObserver(o))
	require.NoError(t, err)
	rw, err := redsem.NewRWMutex(pool, "config", redsem.WithObserver(o))
	require.NoError(t, err)
	gate, err := rate.New(pool, "partner", 1, time.Minute, rate.WithObserver(o))
	require.NoError(t, err)
	el, err := redsem.NewElection(pool, "scheduler", redsem.WithObserver(o))
	require.NoError(t, err)

	l, err := sem.Acquire(ctx)
	require.NoError(t, err)
	_, err = sem.TryAcquire(ctx)
	require.ErrorIs(t, err, redsem.ErrNoToken)
	require.NoError(t, l.Release(ctx))
	tctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	<-tctx.Done()
	_, err = mu.Lock(tctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	l, err = rw.RLock(ctx)
	require.NoError(t, err)
	srv.Do(t, "FLUSHALL")
	require.ErrorIs(t, l.Refresh(ctx, time.Minute), redsem.ErrLeaseLost)
	_, err = gate.Wait(ctx)
	require.NoError(t, err)
	_, err = gate.Allow(ctx)
	require.ErrorIs(t, err, rate.ErrRateLimited)
	lead, err := el.Campaign(ctx, "me")
	require.NoError(t, err)
	require.NoError(t, lead.Resign(ctx))
	caller.End()

	stubs := ended(t, exp, 11)
	var got []span
	for _, s := range stubs {
		if s.Name == "caller" {
			continue
		}
		assert.Equal(t, caller.SpanContext().SpanID(), s.Parent.SpanID(), "%s %s: a child of the caller's span", s.Name, summary(s).kind)
		assert.Equal(t, caller.SpanContext().TraceID(), s.SpanContext.TraceID())
		got = append(got, summary(s))
	}
	assert.ElementsMatch(t, []span{
		{name: WaitSpan, kind: "semaphore", lock: "encoders", outcome: "granted", fence: true},
		{name: WaitSpan, kind: "semaphore", lock: "encoders", outcome: "busy"},
		{name: HoldSpan, kind: "semaphore", lock: "encoders", outcome: "released", fence: true},
		{name: WaitSpan, kind: "mutex", lock: "rollup", outcome: "timeout"},
		{name: WaitSpan, kind: "rwmutex.read", lock: "config", outcome: "granted", fence: true},
		{name: HoldSpan, kind: "rwmutex.read", lock: "config", outcome: "lost", fence: true, status: codes.Error},
		{name: WaitSpan, kind: "rate", lock: "partner", outcome: "granted"},
		{name: WaitSpan, kind: "rate", lock: "partner", outcome: "busy"},
		{name: WaitSpan, kind: "election", lock: "scheduler", outcome: "granted", fence: true},
		{name: HoldSpan, kind: "election", lock: "scheduler", outcome: "released", fence: true},
	}, got)

	snap := counters.Snapshot()
	assert.Equal(t, int64(4), snap.Acquired, "the next Observer hears every event")
	assert.Equal(t, int64(2), snap.Busy)
	assert.Equal(t, int64(1), snap.Timeouts)
}

// TestSpans_redisDown: an acquisition that fails on the connection records
// an error span.
func TestSpans_redisDown(t *testing.T) {
	srv := redistest.Start(t)
	tp, exp := provider(t)
	sem, err := redsem.NewSemaphore(srv.Pool(t), "encoders", 1, redsem.WithObserver(New(tp, nil)))
	require.NoError(t, err)
	srv.Kill()
	_, err = sem.TryAcquire(context.Background())
	require.Error(t, err)
	s := ended(t, exp, 1)[0]
	assert.Equal(t, span{name: WaitSpan, kind: "semaphore", lock: "encoders", outcome: "error", status: codes.Error}, summary(s))
	require.NotEmpty(t, s.Events, "the error is recorded")
	assert.Equal(t, "exception", s.Events[0].Name)
}

// TestSpans_underARequest: behind httpgate, a request's slot shows as a
// wait and a hold under the request's span.
func TestSpans_underARequest(t *testing.T) {
	srv := redistest.Start(t)
	tp, exp := provider(t)
	lim, err := httpgate.New(srv.Pool(t), httpgate.Config{Name: "api", Limit: httpgate.Limit{Slots: 2},
		Options: []redsem.Option{redsem.WithObserver(New(tp, nil))}})
	require.NoError(t, err)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	traced := func(next http.Handler) http.Handler { // what otelhttp does, in two lines
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, s := tp.Tracer("server").Start(r.Context(), "GET /")
			defer s.End()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	hs := httptest.NewServer(traced(lim.Handler(nil, ok)))
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	hs.Close()

	stubs := ended(t, exp, 3)
	byName := map[string]tracetest.SpanStub{}
	for _, s := range stubs {
		byName[s.Name] = s
	}
	request := byName["GET /"].SpanContext.SpanID()
	for _, name := range []string{WaitSpan, HoldSpan} {
		require.Contains(t, byName, name)
		assert.Equal(t, request, byName[name].Parent.SpanID(), "%s is a child of the request's span", name)
		assert.Contains(t, byName[name].Attributes, attribute.String("redsem.name", "api:"))
	}
}

// TestSpans_outcomesAndStatus: the outcomes the table lists that the test
// above does not reach: a write lock (rwmutex.write), a cancelled wait
// (an outcome, not an error), a lease that expired and one whose Release
// failed (Error, outcomes expired and lost); and a hold span starts at
// the grant, after the wait span ended.
func TestSpans_outcomesAndStatus(t *testing.T) {
	srv := redistest.Start(t)
	pool := srv.Pool(t)
	tp, exp := provider(t)
	o := New(tp, nil)
	ctx := context.Background()

	rw, err := redsem.NewRWMutex(pool, "config", redsem.WithObserver(o))
	require.NoError(t, err)
	w, err := rw.Lock(ctx)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = rw.RLock(cctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, w.Release(ctx))

	fixed, err := redsem.NewSemaphore(pool, "short", 1, redsem.WithObserver(o), redsem.WithTTL(50*time.Millisecond), redsem.WithFixedTTL())
	require.NoError(t, err)
	l, err := fixed.Acquire(ctx)
	require.NoError(t, err)
	<-l.Done() // it expires: nothing refreshes it
	sem, err := redsem.NewSemaphore(pool, "encoders", 1, redsem.WithObserver(o))
	require.NoError(t, err)
	l, err = sem.Acquire(ctx)
	require.NoError(t, err)
	srv.Kill()
	require.Error(t, l.Release(ctx), "Redis is gone")

	got := map[string]span{}
	stubs := ended(t, exp, 7)
	for _, s := range stubs {
		got[s.Name+" "+summary(s).kind+" "+summary(s).lock+" "+summary(s).outcome] = summary(s)
	}
	for key, want := range map[string]span{
		"redsem.wait rwmutex.write config granted":  {name: WaitSpan, kind: "rwmutex.write", lock: "config", outcome: "granted", fence: true},
		"redsem.hold rwmutex.write config released": {name: HoldSpan, kind: "rwmutex.write", lock: "config", outcome: "released", fence: true},
		"redsem.wait rwmutex.read config canceled":  {name: WaitSpan, kind: "rwmutex.read", lock: "config", outcome: "canceled"},
		"redsem.hold semaphore short expired":       {name: HoldSpan, kind: "semaphore", lock: "short", outcome: "expired", fence: true, status: codes.Error},
		"redsem.hold semaphore encoders lost":       {name: HoldSpan, kind: "semaphore", lock: "encoders", outcome: "lost", fence: true, status: codes.Error},
	} {
		assert.Equal(t, want, got[key], key)
	}
	var wait, hold tracetest.SpanStub
	for _, s := range stubs {
		if summary(s).lock == "encoders" && s.Name == WaitSpan {
			wait = s
		}
		if summary(s).lock == "encoders" && s.Name == HoldSpan {
			hold = s
		}
	}
	assert.False(t, hold.StartTime.Before(wait.EndTime), "the hold starts at the grant, after the wait ended")
	assert.True(t, hold.EndTime.After(hold.StartTime))
}

// TestSpans_rateUnderARequest: behind httpgate, with the Observer in
// RateOptions, a request's start shows as a wait span under the request's
// span, and a start has no hold span.
func TestSpans_rateUnderARequest(t *testing.T) {
	srv := redistest.Start(t)
	tp, exp := provider(t)
	lim, err := httpgate.New(srv.Pool(t), httpgate.Config{Name: "api", Limit: httpgate.Limit{N: 5, Per: time.Second},
		RateOptions: []rate.Option{rate.WithObserver(New(tp, nil))}})
	require.NoError(t, err)
	next := lim.Handler(nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, s := tp.Tracer("server").Start(r.Context(), "GET /")
		defer s.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	hs.Close()

	stubs := ended(t, exp, 2)
	require.Len(t, stubs, 2, "the request's span and the start's wait, no hold")
	byName := map[string]tracetest.SpanStub{}
	for _, s := range stubs {
		byName[s.Name] = s
	}
	require.Contains(t, byName, WaitSpan)
	assert.Equal(t, byName["GET /"].SpanContext.SpanID(), byName[WaitSpan].Parent.SpanID())
	assert.Equal(t, span{name: WaitSpan, kind: "rate", lock: "api:", outcome: "granted"}, summary(byName[WaitSpan]))
}
