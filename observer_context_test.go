package redsem

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type traceKey struct{}

// tracer is a ContextObserver that writes each acquisition's three calls
// as one line, "kind name: outcome, hold end", checking that each call gets
// what the one before returned, and WaitStarted the caller's context.
type tracer struct {
	recorder
	mu    sync.Mutex
	next  int
	lines map[int]string
	bad   []string
}

// traced is the context key of an acquisition's id.
type traced struct{}

func (tr *tracer) WaitStarted(ctx context.Context, kind, name string) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if ctx.Value(traceKey{}) != "caller" {
		tr.bad = append(tr.bad, "WaitStarted without the caller's context")
	}
	tr.next++
	if tr.lines == nil {
		tr.lines = map[int]string{}
	}
	tr.lines[tr.next] = kind + " " + name + ":"
	return context.WithValue(ctx, traced{}, tr.next)
}

func (tr *tracer) WaitEnded(ctx context.Context, fence int64, err error) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	id, ok := ctx.Value(traced{}).(int)
	if !ok {
		tr.bad = append(tr.bad, "WaitEnded without WaitStarted's context")
	}
	switch {
	case err != nil:
		tr.lines[id] += fmt.Sprintf(" failed %v", err)
	case fence > 0:
		tr.lines[id] += " granted"
	default:
		tr.lines[id] += " granted without a fence"
	}
	return context.WithValue(ctx, traced{}, -id)
}

func (tr *tracer) HoldEnded(ctx context.Context, cause error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	id, ok := ctx.Value(traced{}).(int)
	if !ok || id >= 0 {
		tr.bad = append(tr.bad, "HoldEnded without WaitEnded's context")
		return
	}
	tr.lines[-id] += fmt.Sprintf(", %v", cause)
}

// got returns the lines in the order the acquisitions began.
func (tr *tracer) got() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for i := 1; i <= tr.next; i++ {
		out = append(out, tr.lines[i])
	}
	return out
}

// Every kind of acquisition reports to a ContextObserver with its caller's
// context: its kind and name as it begins, its outcome with the fence, and
// its lease's end, each call given what the previous one returned.
func TestContextObserver_everyKind(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.WithValue(ctxT(t, 10*time.Second), traceKey{}, "caller")
		tr := &tracer{}
		sem := newSem(t, b, "traced-sem", 2, WithObserver(tr))
		mu, err := NewMutex(b.pool, "traced-mu", WithObserver(tr))
		require.NoError(t, err)
		rw, err := NewRWMutex(b.pool, "traced-rw", WithObserver(tr))
		require.NoError(t, err)
		el, err := NewElection(b.pool, "traced-el", WithObserver(tr))
		require.NoError(t, err)

		l, err := sem.AcquireN(ctx, 2)
		require.NoError(t, err)
		_, err = sem.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, l.Release(ctx))
		l, err = mu.Lock(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		l, err = rw.RLock(ctx)
		require.NoError(t, err)
		_, err = rw.TryLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, l.Release(ctx))
		lead, err := el.Campaign(ctx, "me")
		require.NoError(t, err)
		require.NoError(t, lead.Resign(ctx))
		l, err = rw.Lock(ctx)
		require.NoError(t, err)
		b.do(t, "FLUSHALL")
		require.ErrorIs(t, l.Refresh(ctx, time.Minute), ErrLeaseLost)

		want := []string{
			"semaphore traced-sem: granted, " + ErrReleased.Error(),
			"semaphore traced-sem: failed " + ErrNoToken.Error() + `: every slot of "traced-sem" is taken`,
			"mutex traced-mu: granted, " + ErrReleased.Error(),
			"rwmutex.read traced-rw: granted, " + ErrReleased.Error(),
			"rwmutex.write traced-rw: failed " + ErrNoToken.Error() + `: rwmutex "traced-rw" is locked or has waiters`,
			"election traced-el: granted, " + ErrReleased.Error(),
			"rwmutex.write traced-rw: granted, " + ErrLeaseLost.Error(),
		}
		if !assert.Eventually(t, func() bool { return fmt.Sprint(tr.got()) == fmt.Sprint(want) }, 5*time.Second, time.Millisecond,
			"every hold's end is reported") {
			assert.Equal(t, want, tr.got())
		}
		assert.Empty(t, tr.bad)
	})
}

// sequencer is a ContextObserver that records its calls in order, and the
// goroutine each WaitStarted ran on, and whose WaitStarted hands back a
// context already cancelled.
type sequencer struct {
	recorder
	started chan uint64
}

func (s *sequencer) WaitStarted(ctx context.Context, kind, name string) context.Context {
	s.add("wait started", nil)
	s.started <- goroutineID()
	done, cancel := context.WithCancel(ctx)
	cancel()
	return done
}

func (s *sequencer) WaitEnded(ctx context.Context, _ int64, err error) context.Context {
	s.add("wait ended", err)
	return ctx
}

func (s *sequencer) HoldEnded(context.Context, error) { s.add("hold ended", nil) }

// goroutineID is the calling goroutine's number, from its stack's header
// ("goroutine 42 [running]:").
func goroutineID() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	id, _ := strconv.ParseUint(f[1], 10, 64)
	return id
}

// The hook's order and context (docs/tracing.md, "The hook underneath"):
// WaitStarted on the caller's goroutine; WaitEnded right after Acquired or
// AcquireFailed; HoldEnded right after Released or LeaseLost; and the
// acquisition runs under the caller's context, not WaitStarted's (here a
// cancelled one).
func TestContextObserver_orderAndCallersContext(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := &sequencer{started: make(chan uint64, 4)}
		sem := newSem(t, b, "ordered", 1, WithObserver(s))
		me := goroutineID()
		l, err := sem.Acquire(ctx)
		require.NoError(t, err, "the acquisition ran under the caller's context")
		_, err = sem.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, l.Release(ctx))
		for i := 0; i < 2; i++ {
			assert.Equal(t, me, <-s.started, "WaitStarted ran on the caller's goroutine")
		}
		require.Eventually(t, func() bool { n, _ := s.count("hold ended"); return n == 1 }, 5*time.Second, time.Millisecond)
		s.mu.Lock()
		defer s.mu.Unlock()
		assert.Equal(t, []string{"wait started", "acquired", "wait ended", "wait started", "failed", "wait ended",
			"released", "hold ended"}, s.events)
	})
}
