package redsem

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
)

// Counters sees every kind of event: grants with their waits, busy
// TryAcquires, timeouts, cancellations, releases with hold times, lost
// leases, and reclaimed tokens; and it publishes as an expvar.
func TestCountersObserveEveryEvent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		var c Counters
		// The first lease has a long TTL (auto-refresh of a 200ms TTL lost
		// it on a loaded machine); the second is fixed, and expires
		// unreleased.
		s := newSem(t, b, "observed", 1, WithObserver(&c), WithTTL(10*time.Second), WithAutoRefresh())
		fixed := newSem(t, b, "observed", 1, WithObserver(&c), WithTTL(200*time.Millisecond), WithFixedTTL())

		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = s.Acquire(tctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(30*time.Millisecond, cancel)
		_, err = s.Acquire(cctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, int64(1), c.Snapshot().Holding)
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, l.Release(ctx))

		lost, err := fixed.Acquire(ctx) // expires unreleased
		require.NoError(t, err)
		<-lost.Done()
		// The lease ends locally before it does in Redis, by up to the trip
		// of the acquire script (long on a loaded machine): reclaim until
		// Redis has let it expire. Exactly one token comes back, once.
		reclaimed := 0
		for until := time.Now().Add(5 * time.Second); reclaimed == 0 && time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
			n, err := s.Reclaim(ctx)
			require.NoError(t, err)
			reclaimed += n
		}
		require.Equal(t, 1, reclaimed, "the expired lease is reclaimed, once")
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		require.Equal(t, 0, n, "nothing is reclaimed twice")

		require.Eventually(t, func() bool { return c.Snapshot().Lost == 1 }, 5*time.Second, time.Millisecond, "%+v", c.Snapshot())
		snap := c.Snapshot()
		assert.Equal(t, int64(2), snap.Acquired)
		assert.Equal(t, int64(1), snap.Busy)
		assert.Equal(t, int64(1), snap.Timeouts)
		assert.Equal(t, int64(1), snap.Cancellations)
		assert.Equal(t, int64(0), snap.Failures)
		assert.Equal(t, int64(1), snap.Released)
		assert.Equal(t, int64(1), snap.Lost)
		assert.Equal(t, int64(1), snap.Reclaimed)
		assert.Equal(t, int64(0), snap.Holding)
		assert.GreaterOrEqual(t, snap.HoldTotal, 20*time.Millisecond)

		var parsed map[string]float64
		require.NoError(t, json.Unmarshal([]byte(c.String()), &parsed))
		assert.Equal(t, float64(2), parsed["acquired"])
		var _ expvar.Var = &c
	})
}

func TestWithObserverRejectsNil(t *testing.T) {
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
func (r *recorder) Reclaimed(string, int)                            { r.add("reclaimed", nil) }
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
func TestObserverSeesWeightedAcquisitions(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var c Counters
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

// A rate gate reports each start it grants and each refusal or timeout to
// the observer given with WithObserver.
func TestObserverSeesRateGate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		var c Counters
		g := newRateGate(t, b, "observed-rate", 2, time.Minute, rate.WithObserver(&c))
		for i := 0; i < 2; i++ {
			_, err := g.Allow(ctx)
			require.NoError(t, err)
		}
		_, err := g.Allow(ctx)
		require.ErrorIs(t, err, rate.ErrRateLimited)
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = g.Wait(wctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		snap := c.Snapshot()
		assert.Equal(t, int64(2), snap.Acquired)
		assert.Equal(t, int64(1), snap.Busy)
		assert.Equal(t, int64(1), snap.Timeouts)
		assert.Equal(t, int64(0), snap.Failures)
	})
}

// Failed background refreshes reach a RefreshObserver: a refresh that fails
// on the wire (retried until the lease's local deadline, then the lease is
// lost as expired), and one that finds the lease gone.
func TestObserverSeesFailedAutoRefresh(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const ttl = 300 * time.Millisecond
		var failing atomic.Bool
		hp := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
			if failing.Load() && isScript(engine.Refresh, cmd, args) {
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
		case <-time.After(10 * time.Second):
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
		case <-time.After(10 * time.Second):
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
