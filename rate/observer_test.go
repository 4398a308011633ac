package rate

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type callerKey struct{}

// tracer is an Observer with redsem.ContextObserver's wait half: it keeps
// each start's kind, name and outcome, and checks that WaitEnded gets what
// WaitStarted returned, and WaitStarted the caller's context.
type tracer struct {
	mu     sync.Mutex
	starts []string
	ends   []error
	bad    int
}

type startKey struct{}

func (tr *tracer) Acquired(string, time.Duration)             {}
func (tr *tracer) AcquireFailed(string, time.Duration, error) {}

func (tr *tracer) WaitStarted(ctx context.Context, kind, name string) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if ctx.Value(callerKey{}) == nil {
		tr.bad++
	}
	tr.starts = append(tr.starts, kind+" "+name)
	return context.WithValue(ctx, startKey{}, len(tr.starts))
}

func (tr *tracer) WaitEnded(ctx context.Context, fence int64, err error) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if ctx.Value(startKey{}) != len(tr.starts) || fence != 0 {
		tr.bad++
	}
	tr.ends = append(tr.ends, err)
	return ctx
}

// A gate's starts reach an Observer with WaitStarted and WaitEnded, kind
// "rate", with the caller's context, granted or refused.
func TestObserver_context(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := context.WithValue(ctxT(t, 10*time.Second), callerKey{}, 1)
		tr := &tracer{}
		g := newGate(t, b, "traced", 1, time.Minute, WithObserver(tr))
		_, err := g.Wait(ctx)
		require.NoError(t, err)
		_, err = g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited)

		tr.mu.Lock()
		defer tr.mu.Unlock()
		assert.Equal(t, []string{"rate traced", "rate traced"}, tr.starts)
		require.Len(t, tr.ends, 2)
		assert.NoError(t, tr.ends[0])
		assert.True(t, errors.Is(tr.ends[1], ErrRateLimited), "%v", tr.ends[1])
		assert.Zero(t, tr.bad)
	})
}
