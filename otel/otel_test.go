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
	caller.End()

	stubs := ended(t, exp, 9)
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
	}, got)

	snap := counters.Snapshot()
	assert.Equal(t, int64(3), snap.Acquired, "the next Observer hears every event")
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
