package redsem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redsem/redsem/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

func TestSemaphore_WithObserver_rejectsNil(t *testing.T) {
	t.Parallel()
	_, err := NewSemaphore(&hookPool{}, "x", 1, WithObserver(nil))
	assert.ErrorIs(t, err, ErrInvalidOption)
}

// recorder is an Observer that keeps every event, for tests.
type recorder struct {
	mu     sync.Mutex
	events []string
	errs   []error
}

func (r *recorder) add(ev string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	r.errs = append(r.errs, err)
}

func (r *recorder) Acquired(string, time.Duration)                   { r.add("acquired", nil) }
func (r *recorder) AcquireFailed(_ string, _ time.Duration, e error) { r.add("failed", e) }
func (r *recorder) Released(string, time.Duration)                   { r.add("released", nil) }
func (r *recorder) LeaseLost(_ string, _ time.Duration, e error)     { r.add("lost", e) }
func (r *recorder) RefreshFailed(_ string, e error)                  { r.add("refresh failed", e) }

// count is how many events ev were seen, and the errors they carried.
func (r *recorder) count(ev string) (int, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for i, e := range r.events {
		if e == ev {
			errs = append(errs, r.errs[i])
		}
	}
	return len(errs), errs
}

// Weighted acquisitions reach the observer like any other: grants, refusals,
// bad input, and the end of the lease.
func TestSemaphore_WithObserver_seesWeightedAcquisitions(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var c admin.Counters
		s := newSem(t, b, "observed-n", 3, WithObserver(&c))
		l, err := s.AcquireN(ctx, 2)
		require.NoError(t, err)
		_, err = s.TryAcquireN(ctx, 2)
		require.ErrorIs(t, err, ErrNoToken)
		_, err = s.AcquireN(ctx, 4)
		require.ErrorIs(t, err, ErrInvalidSize)
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = s.AcquireN(tctx, 3)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, int64(1), c.Snapshot().Holding)
		require.NoError(t, l.Release(ctx))
		l, err = s.TryAcquireN(ctx, 3)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))

		snap := c.Snapshot()
		assert.Equal(t, int64(2), snap.Acquired)
		assert.Equal(t, int64(1), snap.Busy)
		assert.Equal(t, int64(1), snap.Failures)
		assert.Equal(t, int64(1), snap.Timeouts)
		require.Eventually(t, func() bool { return c.Snapshot().Released == 2 }, 5*time.Second, time.Millisecond)
		assert.Equal(t, int64(0), c.Snapshot().Holding)
	})
}

// Failed background refreshes reach a RefreshObserver: a refresh that fails
// on the wire (retried until the lease's local deadline, then the lease is
// lost as expired), and one that finds the lease gone.
func observerSeesFailedAutoRefresh(t *testing.T) { // run by TestLease_Refresh_inTime
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		// Auto-refresh runs a third of the TTL in; a TTL of seconds lets a
		// loaded machine's late refresh still come before the lease's end
		// (at 300ms, it came after, and found it expired, not lost).
		const ttl = 2 * time.Second
		var failing atomic.Bool
		hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
			if failing.Load() && isScript(engine.Refresh.Script, cmd, args) {
				return errLostReply
			}
			return nil
		}}
		rec := &recorder{}
		s, err := NewSemaphore(hp, "observed-refresh", 2, WithTTL(ttl), WithAutoRefresh(), WithObserver(rec))
		require.NoError(t, err)

		// A refresh that fails on the wire, again and again.
		failing.Store(true)
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		select {
		case <-l.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("the lease outlived its local deadline without a refresh")
		}
		require.ErrorIs(t, l.Err(), ErrLeaseExpired)
		n, errs := rec.count("refresh failed")
		require.GreaterOrEqual(t, n, 1, "failed refreshes are reported")
		for _, e := range errs {
			assert.ErrorIs(t, e, errLostReply)
		}
		require.Eventually(t, func() bool { n, _ := rec.count("lost"); return n == 1 }, 5*time.Second, time.Millisecond)
		require.NoError(t, l.Release(ctx), "expired but not reclaimed: released normally")
		failing.Store(false)

		// A refresh that finds the lease gone.
		l, err = s.Acquire(ctx)
		require.NoError(t, err)
		b.do(t, "HDEL", s.k.holders, "t:"+l.Token())
		select {
		case <-l.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("auto-refresh never noticed the lease was gone")
		}
		require.ErrorIs(t, l.Err(), ErrLeaseLost)
		require.Eventually(t, func() bool { n, _ := rec.count("lost"); return n == 2 }, 5*time.Second, time.Millisecond)
		// The lease reports itself lost before auto-refresh reports the
		// refresh that found it so: wait for that report too.
		require.Eventually(t, func() bool {
			_, errs := rec.count("refresh failed")
			return errors.Is(errs[len(errs)-1], ErrLeaseLost)
		}, 5*time.Second, time.Millisecond, "the refresh that found the lease gone is reported")
	})
}
