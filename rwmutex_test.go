package redsem

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
)

func newRW(t testing.TB, b *backend, name string, opts ...Option) *RWMutex {
	t.Helper()
	m, err := NewRWMutex(b.pool, name, opts...)
	require.NoError(t, err)
	return m
}

// lockAsync runs lock in a goroutine; the channel yields its lease, or an
// error.
type lockResult struct {
	l   *Lease
	err error
}

func lockAsync(ctx context.Context, lock func(context.Context) (*Lease, error)) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := lock(ctx)
		ch <- lockResult{l, err}
	}()
	return ch
}

// waitRWQueue waits until the lock's queue holds n waiters.
func waitRWQueue(t *testing.T, m *RWMutex, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := m.Status(context.Background())
		return err == nil && len(st.Queue) == n
	}, 5*time.Second, 2*time.Millisecond, "queue never reached %d waiters", n)
}

func granted(t *testing.T, ch <-chan lockResult) *Lease {
	t.Helper()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r.l
	case <-time.After(20 * time.Second):
		t.Fatal("not granted within 20s")
		return nil
	}
}

func notGranted(t *testing.T, ch <-chan lockResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("granted too early: %v %v", r.l.Token(), r.err)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestRWMutex_Lock_readersShareWriterExcludes(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		m := newRW(t, b, "index")
		rs := holdN(t, ctx, m.RLock, 3)
		_, err := m.TryLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		st, err := m.Status(ctx)
		require.NoError(t, err)
		assert.Len(t, st.Readers, 3)
		assert.Nil(t, st.Writer)
		for _, l := range rs {
			require.NoError(t, l.Release(ctx))
		}
		w, err := m.TryLock(ctx)
		require.NoError(t, err)
		_, err = m.TryRLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		_, err = m.TryLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		st, err = m.Status(ctx)
		require.NoError(t, err)
		require.NotNil(t, st.Writer)
		assert.Equal(t, w.Fence(), st.Writer.Fence)
		assert.Empty(t, st.Readers)
		require.NoError(t, w.Release(ctx))
		require.ErrorIs(t, w.Release(ctx), ErrReleased)
		r, err := m.TryRLock(ctx)
		require.NoError(t, err)
		require.NoError(t, r.Release(ctx))
	})
}

// A writer that waits is not starved by readers that come after it, and
// the readers queued behind it go in together when it releases; a reader
// behind a second writer waits for that one too (FIFO, readers batched).
func TestRWMutex_Lock_fairQueue(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		m := newRW(t, b, "fair")
		r0, err := m.RLock(ctx)
		require.NoError(t, err)

		w1 := lockAsync(ctx, m.Lock)
		waitRWQueue(t, m, 1)
		_, err = m.TryRLock(ctx) // a reader after a queued writer waits
		require.ErrorIs(t, err, ErrNoToken)
		r1 := lockAsync(ctx, m.RLock)
		waitRWQueue(t, m, 2)
		r2 := lockAsync(ctx, m.RLock)
		waitRWQueue(t, m, 3)
		w2 := lockAsync(ctx, m.Lock)
		waitRWQueue(t, m, 4)
		r3 := lockAsync(ctx, m.RLock)
		waitRWQueue(t, m, 5)
		st, err := m.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, []bool{true, false, false, true, false}, writes(st.Queue))
		notGranted(t, w1)

		require.NoError(t, r0.Release(ctx))
		lw1 := granted(t, w1)
		assert.Greater(t, lw1.Fence(), r0.Fence())
		notGranted(t, r1)

		require.NoError(t, lw1.Release(ctx))
		l1, l2 := granted(t, r1), granted(t, r2) // together
		notGranted(t, w2)
		notGranted(t, r3)
		assert.Greater(t, l1.Fence(), lw1.Fence())
		assert.Greater(t, l2.Fence(), lw1.Fence())

		require.NoError(t, l1.Release(ctx))
		notGranted(t, w2)
		require.NoError(t, l2.Release(ctx))
		lw2 := granted(t, w2)
		assert.Greater(t, lw2.Fence(), l1.Fence(), "a writer's fence exceeds every earlier reader's")
		assert.Greater(t, lw2.Fence(), l2.Fence())
		notGranted(t, r3)
		require.NoError(t, lw2.Release(ctx))
		require.NoError(t, granted(t, r3).Release(ctx))
		st, err = m.Status(ctx)
		require.NoError(t, err)
		assert.Empty(t, st.Queue)
		assert.Empty(t, st.Readers)
		assert.Nil(t, st.Writer)
	})
}

func writes(q []admin.RWWaiter) []bool {
	var out []bool
	for _, w := range q {
		out = append(out, w.Write)
	}
	return out
}

// A holder that never releases loses the lock within one TTL, reclaimed by
// the waiters themselves: one that is never reclaimed fails granted when
// ctx ends.
func TestRWMutex_Lock_waitersReclaimAbandonedLeases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const ttl = 300 * time.Millisecond
		m := newRW(t, b, "abandoned", WithTTL(ttl), WithFixedTTL())
		_, err := m.Lock(ctx) // abandoned: never released
		require.NoError(t, err)
		r := lockAsync(ctx, newRW(t, b, "abandoned", WithTTL(ttl)).RLock)
		l := granted(t, r)
		require.NoError(t, l.Release(ctx))

		for i := 0; i < 2; i++ {
			_, err := m.RLock(ctx) // abandoned readers
			require.NoError(t, err)
		}
		l = granted(t, lockAsync(ctx, newRW(t, b, "abandoned", WithTTL(ttl)).Lock))
		require.NoError(t, l.Release(ctx))
	})
}

// A wait whose context ends leaves the queue at once and lets in whoever it
// held up.
func TestRWMutex_Lock_cancelledWaitLeavesQueue(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		m := newRW(t, b, "cancel")
		r0, err := m.RLock(ctx)
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w := lockAsync(wctx, m.Lock)
		waitRWQueue(t, m, 1)
		r1 := lockAsync(ctx, m.RLock) // behind the writer
		waitRWQueue(t, m, 2)
		cancel()
		res := <-w
		require.ErrorIs(t, res.err, context.Canceled)
		l1 := granted(t, r1) // the writer that held it up is gone
		st, err := m.Status(ctx)
		require.NoError(t, err)
		assert.Empty(t, st.Queue)
		assert.Len(t, st.Readers, 2)
		require.NoError(t, r0.Release(ctx))
		require.NoError(t, l1.Release(ctx))
		l, err := m.TryLock(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	})
}

// A waiter that dies in the queue and is then let in holds the lock only
// for the short grant a waiter's own script has to confirm, not one TTL.
func TestRWMutex_Lock_deadWaiterGrantIsShort(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		m, w := ghostBehindWriter(t, ctx, b, "ghost", 20*time.Second)
		require.NoError(t, w.Release(ctx)) // the ghost is granted, provisionally
		st, err := m.Status(ctx)
		require.NoError(t, err)
		require.Len(t, st.Readers, 1)
		// ctx (20s) ends before the TTL (a minute): the ghost's grant lasts
		// about a second, not the TTL.
		l, err := m.Lock(ctx)
		require.NoError(t, err, "the ghost's grant lasts about a second, not the TTL")
		require.NoError(t, l.Release(ctx))
	})
}

// A waiter that dies in the queue behind a holder is forgotten by the next
// acquisition once its liveness deadline passes: it neither stays in the
// queue nor waits there for the holder to let it in.
func TestRWMutex_Lock_deadWaiterIsForgotten(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		m, w := ghostBehindWriter(t, ctx, b, "forgotten", 100*time.Millisecond)
		st, err := m.Status(ctx)
		require.NoError(t, err)
		require.Len(t, st.Queue, 1)
		require.Eventually(t, func() bool {
			_, err := m.TryRLock(ctx) // refused behind the writer; forgets the dead
			if !errors.Is(err, ErrNoToken) {
				return false
			}
			st, err := m.Status(ctx)
			return err == nil && len(st.Queue) == 0 && b.zcard(t, m.s.k.waits) == 0
		}, 20*time.Second, 20*time.Millisecond, "the dead waiter is still queued")
		require.NoError(t, w.Release(ctx))
	})
}

// ghostBehindWriter makes an RWMutex name (no grace, TTL a minute) that a
// writer holds and a reader waits on for block, as its process would
// before it dies.
func ghostBehindWriter(t *testing.T, ctx context.Context, b *backend, name string, block time.Duration) (*RWMutex, *Lease) {
	t.Helper()
	m := newRW(t, b, name, WithGrace(0), WithTTL(time.Minute))
	w, err := m.Lock(ctx)
	require.NoError(t, err)
	ghost := &rwSide{oneToken: oneToken{s: m.s}, mode: "r"}
	conn := b.pool.Get()
	defer conn.Close()
	r, err := ghost.First(ctx, conn, "0123456789abcdef0123456789abcdef", block)
	require.NoError(t, err)
	require.EqualValues(t, 0, r.Code, "the ghost waits")
	return m, w
}

func rwLeaseContract(t *testing.T) { // run by TestLease_Refresh_inTime
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		// TTLs of a second and more: a loaded machine's slow round trip or
		// late refresh must not end a lease the test means to be live.
		// The first lease's TTL leaves a -race run on a loaded machine
		// time between its grant and its refresh (CI met 1 s expiring).
		long := newRW(t, b, "contract", WithTTL(10*time.Second), WithFixedTTL())
		l, err := long.Lock(ctx)
		require.NoError(t, err)
		assert.Regexp(t, `^[0-9a-f]{12}:w$`, l.Token())
		require.NoError(t, l.Refresh(ctx, 10*time.Second))
		require.NoError(t, l.Release(ctx))
		require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrReleased)

		m := newRW(t, b, "contract", WithTTL(time.Second), WithFixedTTL())

		r, err := m.RLock(ctx)
		require.NoError(t, err)
		assert.Regexp(t, `^[0-9a-f]{12}:r$`, r.Token())
		select {
		case <-r.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("a fixed lease did not end at its TTL")
		}
		require.ErrorIs(t, r.Err(), ErrLeaseExpired)
		w, err := m.Lock(ctx) // reclaims the expired read lease
		require.NoError(t, err)
		require.ErrorIs(t, r.Release(ctx), ErrLeaseLost)
		require.NoError(t, w.Release(ctx))

		// Auto-refresh keeps a live holder's lease past its TTL.
		a := newRW(t, b, "contract", WithTTL(2*time.Second))
		al, err := a.RLock(ctx)
		require.NoError(t, err)
		time.Sleep(6 * time.Second) // three TTLs
		_, err = a.TryLock(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		require.True(t, al.Valid())
		require.NoError(t, al.Release(ctx))
	})
}

func TestRWMutex_New_options(t *testing.T) {
	t.Parallel()
	m := miniredisT(t)
	p := newPool(t, m.Addr())
	_, err := NewRWMutex(p, "x", WithAdoptSize())
	require.ErrorIs(t, err, ErrInvalidOption)
	_, err = NewRWMutex(p, "x", WithWaitConnections(1))
	require.ErrorIs(t, err, ErrInvalidOption)
	_, err = NewRWMutex(p, "")
	require.ErrorIs(t, err, ErrInvalidName)
	_, err = NewRWMutex(p, "x", WithTTL(time.Millisecond))
	require.ErrorIs(t, err, ErrInvalidTTL)
}

// An RWMutex and a Semaphore of one name are two locks, in one slot.
func TestRWMutex_New_keysApart(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		m := newRW(t, b, "shared-name")
		s := newSem(t, b, "shared-name", 1)
		w, err := m.Lock(ctx)
		require.NoError(t, err)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, w.Release(ctx))
		keys, err := redis.Strings(b.do(t, "KEYS", "*"), nil)
		require.NoError(t, err)
		for _, k := range keys {
			assert.Contains(t, k, "{shared-name}:")
		}
	})
}

// A read-write lock's fence too large to grow (2^53 and above, or the
// bound below it) is corruption, as a semaphore's is: RLock and Lock
// refuse it with ErrCorrupt and write nothing.
func TestRWMutex_Lock_fenceTooLargeIsCorrupt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, fence := range []string{"9000000000000000", "9007199254740993"} {
			ctx := ctxT(t, 10*time.Second)
			m := newRW(t, b, "rw-fence-"+fence)
			l, err := m.TryRLock(ctx)
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
			b.do(t, "HSET", m.s.k.meta, "fence", fence)
			before := b.snapshot(t)
			_, err = m.TryRLock(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "TryRLock, fence %s", fence)
			_, err = m.TryLock(ctx)
			assert.ErrorIs(t, err, ErrCorrupt, "TryLock, fence %s", fence)
			assert.Equal(t, before, b.snapshot(t), "nothing written, fence %s", fence)
		}
	})
}

// A waiter's grant is confirmed once: settling it by its id afterwards (as
// after a lost reply) reports the lease as it is, deadline included, and
// does not extend it.
func TestRWMutex_Lock_confirmedGrantResolvesAsItIs(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		m := newRW(t, b, "rw-confirmed")
		w, err := m.Lock(ctx)
		require.NoError(t, err)
		ch := lockAsync(ctx, m.RLock)
		waitRWQueue(t, m, 1)
		require.NoError(t, w.Release(ctx))
		r := granted(t, ch) // provisional, then confirmed by its own run
		deadline, err := redis.Int64(b.do(t, "ZSCORE", m.s.k.leases, r.acqID), nil)
		require.NoError(t, err)

		time.Sleep(20 * time.Millisecond)
		c, err := b.pool.GetContext(ctx)
		require.NoError(t, err)
		defer c.Close()
		args := append(append(m.s.k.rw(), m.s.k.bell(r.acqID)), r.acqID, "resolve", 100, m.TTL().Milliseconds())
		got, err := parseRWReply(engine.RWAbort.Do(c, args...))
		require.NoError(t, err)
		assert.Equal(t, int64(engine.CodeGranted), got.Code)
		assert.Equal(t, deadline, got.DeadlineMs, "resolved as it is, not extended")
		require.NoError(t, r.Release(ctx))
	})
}
