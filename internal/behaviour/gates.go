package behaviour

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

func testMutex(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	m, err := redsem.NewMutex(e.tg.Pool, e.name)
	require.NoError(t, err)
	l, err := m.Lock(c)
	require.NoError(t, err)
	_, err = m.TryLock(c)
	require.ErrorIs(t, err, redsem.ErrNoToken)
	// A semaphore of another size under the mutex's name is refused.
	_, err = e.sem(t, 2).TryAcquire(c)
	require.ErrorIs(t, err, redsem.ErrSizeMismatch)
	got := make(chan error, 1)
	var next *redsem.Lease
	go func() {
		var err error
		next, err = m.Lock(c)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second Lock returned while the mutex was held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, l.Release(c))
	require.NoError(t, <-got)
	require.NoError(t, next.Release(c))
	e.requireWhole(t, 1, 0)
}

// testRateGateAllow: Allow grants n starts per interval, then refuses with
// a RetryAfter; a client disagreeing on the rate is refused.
func testRateGateAllow(t *testing.T, e *env) {
	c := ctx(t, 20*time.Second)
	g, err := rate.New(e.tg.Pool, e.name, 2, 2*time.Second)
	require.NoError(t, err)
	a, err := g.Allow(c)
	require.NoError(t, err)
	b, err := g.Allow(c)
	require.NoError(t, err)
	assert.True(t, b.At.After(a.At), "grant times increase: %v, %v", a.At, b.At)
	_, err = g.Allow(c)
	require.ErrorIs(t, err, rate.ErrRateLimited)
	var rl *rate.LimitedError
	require.True(t, errors.As(err, &rl), "%T", err)
	assert.Greater(t, rl.RetryAfter, time.Duration(0))
	assert.LessOrEqual(t, rl.RetryAfter, 2*time.Second)

	other, err := rate.New(e.tg.Pool, e.name, 3, 2*time.Second)
	require.NoError(t, err)
	_, err = other.Allow(c)
	require.ErrorIs(t, err, rate.ErrRateMismatch)
}

// testRateGateWait: Wait blocks until a start is allowed; no window of the
// interval holds more than n grants; a Wait whose context ends returns its
// error.
func testRateGateWait(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	const n, per = 2, 300 * time.Millisecond
	g, err := rate.New(e.tg.Pool, e.name, n, per)
	require.NoError(t, err)
	var at []time.Time
	for i := 0; i < 5; i++ {
		st, err := g.Wait(c)
		require.NoError(t, err)
		at = append(at, st.At)
	}
	for i := n; i < len(at); i++ {
		assert.GreaterOrEqual(t, at[i].Sub(at[i-n]), per, "grants %d and %d", i-n, i)
	}
	// A gate used up for seconds: a short Wait ends with its context.
	slow, err := rate.New(e.tg.Pool, e.name+"-slow", 1, 5*time.Second)
	require.NoError(t, err)
	_, err = slow.Allow(c)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(c, 30*time.Millisecond)
	defer cancel()
	_, err = slow.Wait(wctx) // a Wait past its context would be granted after 5s
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// testRateQuota: a quota of two limits takes each start from both or from
// neither, waits FIFO in WaitN, refuses a start above a limit at once, and
// follows SetLimits for every client; all of it in one script per start, on
// the quota's one slot.
func testRateQuota(t *testing.T, e *env) {
	c := ctx(t, 30*time.Second)
	limits := []rate.Limit{{N: 2, Per: 400 * time.Millisecond}, {N: 100, Per: 400 * time.Millisecond}}
	q, err := rate.NewQuota(e.tg.Pool, e.name, limits)
	require.NoError(t, err)
	first, err := q.AllowN(c, 1, 70)
	require.NoError(t, err)
	_, err = q.AllowN(c, 1, 40)
	require.ErrorIs(t, err, rate.ErrRateLimited, "tokens: 70+40 > 100")
	_, err = q.AllowN(c, 1, 30)
	require.NoError(t, err, "the refused start took no request")
	_, err = q.AllowN(c, 1, 101)
	require.ErrorIs(t, err, rate.ErrTooLarge)

	// Both requests are used: WaitN waits for the first start to leave.
	st, err := q.WaitN(c, 1, 50)
	require.NoError(t, err)
	assert.False(t, st.At.Before(first.At.Add(limits[0].Per)), "granted %v after the first start, before its window ended", st.At.Sub(first.At))

	// Another client made with other limits follows them once they are set.
	other, err := rate.NewQuota(e.tg.Pool, e.name, []rate.Limit{{N: 3, Per: time.Second}, {N: 10, Per: time.Second}})
	require.NoError(t, err)
	_, err = other.AllowN(c, 1, 1)
	require.ErrorIs(t, err, rate.ErrRateMismatch)
	// The same per, so that no grant the gate forgot counts (a longer per
	// admits nothing until the old window's grants could have left the new
	// one: docs/rate-gate.md).
	require.NoError(t, q.SetLimits(c, rate.Limit{N: 5, Per: 400 * time.Millisecond}, rate.Limit{N: 1000, Per: 400 * time.Millisecond}))
	_, err = other.AllowN(c, 1, 500)
	require.NoError(t, err, "the stored limits are in force for every client")
	s, err := other.Status(c)
	require.NoError(t, err)
	require.Len(t, s.Limits, 2)
	assert.Equal(t, rate.Limit{N: 1000, Per: 400 * time.Millisecond}, s.Limits[1].Limit)
	assert.True(t, s.Set)
}
