package rate

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// Idle expiry (WithIdleExpiry): a gate's keys expire once the window of its
// last start has passed, no waiter is live and the idle time has passed;
// never while a start is in its window or a waiter is registered.

// expireTimes returns every key of g with its PEXPIRETIME (ms; -1: none).
func expireTimes(t testing.TB, b *backend, g *Gate) map[string]int64 {
	out := map[string]int64{}
	for _, k := range rateKeysOf(t, b, g) {
		at, err := redis.Int64(b.do(t, "PEXPIRETIME", k), nil)
		require.NoError(t, err)
		out[k] = at
	}
	return out
}

// requireOneExpiry requires every key of g to expire at the same moment, at
// least at, and returns it (ms of Redis TIME).
func requireOneExpiry(t testing.TB, b *backend, g *Gate, at time.Time) int64 {
	t.Helper()
	times := expireTimes(t, b, g)
	require.NotEmpty(t, times)
	var exp int64
	for k, ms := range times {
		if exp == 0 {
			exp = ms
		}
		require.Equal(t, exp, ms, "key %s expires at another time: %v", k, times)
	}
	require.GreaterOrEqual(t, exp, at.UnixMilli(), "the keys expire before %v: %v", at, times)
	return exp
}

// clock is a miniredis whose TIME stands still until advance moves it and
// the keys' TTLs with it.
type clock struct {
	b   *backend
	now time.Time
}

func stopClock(b *backend) *clock {
	c := &clock{b: b, now: time.Now().Truncate(time.Millisecond)}
	b.mini.SetTime(c.now)
	return c
}

func (c *clock) advance(d time.Duration) {
	c.now = c.now.Add(d)
	c.b.mini.SetTime(c.now)
	c.b.mini.FastForward(d)
}

func TestIdleExpiry_badInput(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{-time.Second, time.Millisecond, 99 * time.Millisecond, MaxPer + time.Second} {
		_, err := New(noPool{}, "api", 1, time.Second, WithIdleExpiry(d))
		require.ErrorIs(t, err, ErrInvalidOption, "%v", d)
	}
	for _, d := range []time.Duration{0, 100 * time.Millisecond, MaxPer} {
		_, err := New(noPool{}, "api", 1, time.Second, WithIdleExpiry(d))
		require.NoError(t, err, "%v", d)
	}
}

// TestIdleExpiry_keysGoOnceIdle: the keys of a gate used and left alone
// all expire at one moment, the end of the last start's window plus the
// idle time, and no key of the name is left after it; the next start
// creates the gate again, with a later grant time.
func TestIdleExpiry_keysGoOnceIdle(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		per, idle := slowWindow(b), 100*time.Millisecond
		g := newGate(t, b, "tenant-a", 2, per, WithIdleExpiry(idle))
		var c *clock
		if b.mini != nil {
			c = stopClock(b)
		}
		first, err := g.Allow(ctx)
		require.NoError(t, err)
		last, err := g.Allow(ctx)
		require.NoError(t, err)
		exp := requireOneExpiry(t, b, g, last.At.Add(per+idle))
		st, err := g.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, idle, st.IdleExpiry)
		assert.Equal(t, time.UnixMilli(exp).Sub(st.ServerTime), st.IdleExpiresIn)

		if c != nil {
			c.advance(per + idle - time.Millisecond)
			require.NotEmpty(t, rateKeysOf(t, b, g), "the keys went before the idle time had passed")
			_, err := g.Allow(ctx)
			require.NoError(t, err, "the window passed")
			c.advance(per + idle + time.Millisecond)
		}
		require.Eventually(t, func() bool { return len(rateKeysOf(t, b, g)) == 0 }, 20*time.Second, 10*time.Millisecond,
			"keys left: %v", rateKeysOf(t, b, g))
		again, err := g.Allow(ctx)
		require.NoError(t, err)
		assert.True(t, again.At.After(first.At.Add(per)), "a grant time after the gate came back: %v, first %v", again.At, first.At)
	})
}

// TestIdleExpiry_gateInUseKeepsItsKeys: a start in its window, or a waiter
// registered, keeps every key, however long the idle time has passed since
// the last start; the waiter then gets its start within the gate's rule.
func TestIdleExpiry_gateInUseKeepsItsKeys(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		per, idle := slowWindow(b), 100*time.Millisecond
		g := newGate(t, b, "tenant-b", 1, per, WithIdleExpiry(idle))
		var c *clock
		if b.mini != nil {
			c = stopClock(b)
		}
		first, err := g.Allow(ctx)
		require.NoError(t, err)
		requireOneExpiry(t, b, g, first.At.Add(per+idle))

		got := make(chan Start, 1)
		go func() {
			st, err := g.Wait(ctx)
			assert.NoError(t, err)
			got <- st
		}()
		require.Eventually(t, func() bool {
			st, err := g.Status(ctx)
			return err == nil && st.Waiting == 1
		}, 20*time.Second, time.Millisecond)
		// The waiter's liveness deadline keeps the keys past the window.
		deadline, err := redis.Int64(b.do(t, "ZSCORE", g.q.k.waits, "w:"+onlyWaiter(t, b, g)), nil)
		require.NoError(t, err)
		requireOneExpiry(t, b, g, time.UnixMicro(deadline).Add(idle))
		if c != nil {
			// Past the window and the idle time: an expiry that forgot the
			// waiter would have taken the keys now.
			c.advance(per + 2*idle)
			keys := rateKeysOf(t, b, g)
			for _, k := range []string{g.q.k.meta, g.q.k.holders, g.q.k.queue, g.q.k.waits, g.q.k.logs[0]} {
				require.Contains(t, keys, k, "a waiter is registered")
			}
		}
		var next Start
		select {
		case next = <-got:
		case <-ctx.Done():
			t.Fatal("the waiter got no start")
		}
		assert.GreaterOrEqual(t, next.At.Sub(first.At), per, "the waiter's start is in the first one's window")
		requireOneExpiry(t, b, g, next.At.Add(per+idle))
		if c != nil {
			c.advance(per + idle)
		}
		require.Eventually(t, func() bool { return len(rateKeysOf(t, b, g)) == 0 }, 20*time.Second, 10*time.Millisecond)
	})
}

// slowWindow is a window long enough on a real redis-server that the
// test's next few commands, however loaded the machine, run inside it.
func slowWindow(b *backend) time.Duration {
	if b.mini != nil {
		return time.Second // its TIME stands still (stopClock)
	}
	return 3 * time.Second
}

// onlyWaiter is the acquisition id of the gate's one registered waiter.
func onlyWaiter(t testing.TB, b *backend, g *Gate) string {
	t.Helper()
	q, err := redis.Strings(b.do(t, "LRANGE", g.q.k.queue, 0, -1), nil)
	require.NoError(t, err)
	require.Len(t, q, 1)
	return q[0]
}

// TestIdleExpiry_busyGateKeepsItsWindow: Allow tried every few
// milliseconds never finds a gate whose keys went while its last start was
// in the window: no two starts are closer than per, as without the expiry.
func TestIdleExpiry_busyGateKeepsItsWindow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		const per = 300 * time.Millisecond
		g := newGate(t, b, "busy", 1, per, WithIdleExpiry(100*time.Millisecond))
		var starts []time.Time
		for tries := 0; len(starts) < 4 && tries < 100_000; tries++ {
			st, err := g.Allow(ctx)
			if err == nil {
				starts = append(starts, st.At)
				continue
			}
			require.ErrorIs(t, err, ErrRateLimited)
			time.Sleep(2 * time.Millisecond)
		}
		require.Len(t, starts, 4)
		for i := 1; i < len(starts); i++ {
			require.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), per, "start %d came %v after the last", i, starts[i].Sub(starts[i-1]))
		}
	})
}

// TestIdleExpiry_offByDefault: a gate without the option has no key with a
// TTL, and a start without it turns off the expiry another client's start
// set (the last start's setting applies).
func TestIdleExpiry_offByDefault(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		plain := newGate(t, b, "mixed", 5, time.Second)
		idling := newGate(t, b, "mixed", 5, time.Second, WithIdleExpiry(time.Second))
		_, err := plain.Allow(ctx)
		require.NoError(t, err)
		for k, at := range expireTimes(t, b, plain) {
			require.Equal(t, int64(-1), at, "%s has a TTL", k)
		}
		_, err = idling.Allow(ctx)
		require.NoError(t, err)
		for k, at := range expireTimes(t, b, plain) {
			require.Positive(t, at, "%s has no TTL", k)
		}
		_, err = plain.Allow(ctx)
		require.NoError(t, err)
		for k, at := range expireTimes(t, b, plain) {
			require.Equal(t, int64(-1), at, "%s keeps a TTL", k)
		}
		st, err := plain.Status(ctx)
		require.NoError(t, err)
		assert.Zero(t, st.IdleExpiry)
		assert.Zero(t, st.IdleExpiresIn)
	})
}

// TestIdleExpiry_setRateLastsWhileInUse: SetRate keeps the gate's idle
// time and moves the expiry with its change; once the keys expire the rate
// set is gone, and the next start creates the gate with its own rate.
func TestIdleExpiry_setRateLastsWhileInUse(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		const per, idle = 200 * time.Millisecond, 100 * time.Millisecond
		g := newGate(t, b, "set", 1, per, WithIdleExpiry(idle))
		var c *clock
		if b.mini != nil {
			c = stopClock(b)
		}
		_, err := g.Allow(ctx)
		require.NoError(t, err)
		require.NoError(t, g.SetRate(ctx, 3, 2*per))
		st, err := g.Status(ctx)
		require.NoError(t, err)
		require.True(t, st.Set)
		assert.Equal(t, idle, st.IdleExpiry, "SetRate keeps the idle time")
		requireOneExpiry(t, b, g, st.Changed.Add(2*per+idle))
		if c != nil {
			c.advance(2*per + 2*idle)
		}
		require.Eventually(t, func() bool { return len(rateKeysOf(t, b, g)) == 0 }, 20*time.Second, 10*time.Millisecond)
		_, err = g.Allow(ctx)
		require.NoError(t, err)
		st, err = g.Status(ctx)
		require.NoError(t, err)
		assert.False(t, st.Set)
		assert.Equal(t, 1, st.Limit, "the rate set lasted only while the gate was in use")
	})
}

// noPool is a Pool a constructor may check but never use.
type noPool struct{}

func (noPool) GetContext(context.Context) (redis.Conn, error) { panic("no I/O expected") }

// TestIdleExpiry_longerPerAfterExpiryCountsTheOldGrants: a SetRate whose
// per reaches back past the moment the gate's keys expired counts the
// grants it can no longer see as taken, as any longer per does: nothing is
// admitted until the new window has left them behind.
func TestIdleExpiry_longerPerAfterExpiryCountsTheOldGrants(t *testing.T) {
	t.Parallel()
	// On miniredis alone: the steps need a clock that stands still.
	eachBackend(t, func(t *testing.T, b *backend) {
		if b.mini == nil {
			return
		}
		ctx := ctxT(t, time.Minute)
		const per, idle = 200 * time.Millisecond, 100 * time.Millisecond
		g := newGate(t, b, "longer", 2, per, WithIdleExpiry(idle))
		c := stopClock(b)
		for i := 0; i < 2; i++ {
			_, err := g.Allow(ctx)
			require.NoError(t, err)
		}
		c.advance(per + idle + time.Millisecond)
		require.Empty(t, rateKeysOf(t, b, g))
		require.NoError(t, g.SetRate(ctx, 2, 10*per)) // the window reaches the two starts
		st, err := g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited, "the window (now-2s, now] holds the two starts before the expiry")
		assert.Equal(t, 10*per-idle, st.RetryAfter)
		c.advance(10*per - idle)
		_, err = g.Allow(ctx)
		require.NoError(t, err, "the window has left them behind")
	})
}

// TestIdleExpiry_tombstoneWithoutGate: a wait settled on a gate that does
// not exist (never made, or its keys expired) leaves its tombstone in a
// waits key that expires with the tombstone; the gate made next keeps
// waits for as long as it lives (no TTL without the option).
func TestIdleExpiry_tombstoneWithoutGate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		g := newGate(t, b, "ghost", 1, time.Second)
		if b.mini != nil {
			// miniredis keeps a TTL, not a time, and answers PEXPIRETIME
			// from its clock read again: a clock that stands still.
			stopClock(b)
		}
		p := &takeUnits{q: g.q, units: []int{1}}
		_, err := p.Abort(ctx, engine.NewAcqID(), "release")
		require.NoError(t, err)
		require.Equal(t, []string{g.q.k.waits}, rateKeysOf(t, b, g), "the tombstone alone")
		last, err := redis.Strings(b.do(t, "ZRANGE", g.q.k.waits, -1, -1, "WITHSCORES"), nil)
		require.NoError(t, err)
		require.Len(t, last, 2)
		deadlineUs, err := strconv.ParseInt(last[1], 10, 64)
		require.NoError(t, err)
		at, err := redis.Int64(b.do(t, "PEXPIRETIME", g.q.k.waits), nil)
		require.NoError(t, err)
		require.Equal(t, (deadlineUs+999)/1000, at, "waits expires with its tombstone")
		_, err = g.Allow(ctx)
		require.NoError(t, err)
		assert.Equal(t, -1, b.num(t, "PTTL", g.q.k.waits), "the gate made keeps its waits")
	})
}

// TestIdleExpiry_startsASetRateGrantsKeepTheirWindow: a start SetRate
// grants to a waiter (a rate change serves the queue) whose client is gone
// keeps the keys as long as a start of the client's own rate would, its
// window plus the idle time: a client that creates the gate again once the
// keys expire follows its own rate, and must still see that start.
func TestIdleExpiry_startsASetRateGrantsKeepTheirWindow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		const per, idle = time.Second, 100 * time.Millisecond
		g := newGate(t, b, "served", 1, per, WithIdleExpiry(idle), WithGrace(100*time.Millisecond))
		var c *clock // on miniredis, a clock that stands still; Redis's goes on
		if b.mini != nil {
			c = stopClock(b)
		}
		_, err := g.Allow(ctx)
		require.NoError(t, err)
		// A waiter that registers and never runs again (its process died).
		conn, err := b.pool.GetContext(ctx)
		require.NoError(t, err)
		acq := engine.NewAcqID()
		r, err := (&takeUnits{q: g.q, units: []int{1}}).First(ctx, conn, acq, 10*time.Second)
		require.NoError(t, conn.Close())
		require.NoError(t, err)
		require.EqualValues(t, engine.CodeWaiting, r.Code)
		if c != nil {
			c.advance(per / 2)
		} else {
			time.Sleep(per / 2) // the served start falls that far past the first
		}
		require.NoError(t, g.SetRate(ctx, 2, per/5)) // serves the waiter now
		rec, err := redis.String(b.do(t, "HGET", g.q.k.holders, "g:"+acq), nil)
		require.NoError(t, err, "the waiter was not served")
		servedUs, err := strconv.ParseInt(strings.Fields(rec)[0], 10, 64)
		require.NoError(t, err)
		served := time.UnixMicro(servedUs)
		exp := requireOneExpiry(t, b, g, served.Add(per+idle))
		// Once the keys expire, the gate made again with the client's own
		// rate starts after the served start's window.
		if c != nil {
			c.advance(time.UnixMilli(exp).Sub(c.now) + time.Millisecond)
		}
		require.Eventually(t, func() bool { return len(rateKeysOf(t, b, g)) == 0 }, 20*time.Second, 20*time.Millisecond,
			"the keys outlive their expiry")
		again, err := g.Allow(ctx)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, again.At.Sub(served), per, "a start in the served start's window")
	})
}
