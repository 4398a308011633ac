package rate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

func TestQuotaBadInput(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, c := range []struct {
			limits []Limit
			want   error
		}{
			{nil, ErrInvalidSize},
			{make([]Limit, MaxLimits+1), ErrInvalidSize},
			{[]Limit{{1, time.Second}, {0, time.Second}}, ErrInvalidSize},
			{[]Limit{{1, time.Second}, {1, 0}}, ErrInvalidInterval},
		} {
			q, err := NewQuota(b.pool, "q", c.limits)
			require.ErrorIs(t, err, c.want, "%v", c.limits)
			assert.Nil(t, q)
		}
		q, err := NewQuota(b.pool, "q", []Limit{{2, time.Hour}, {100, time.Hour}})
		require.NoError(t, err)
		ctx := ctxT(t, 5*time.Second)
		for _, units := range [][]int{{1}, {1, 2, 3}, {0, 0}, {-1, 5}, {1, MaxN + 1}} {
			_, err := q.AllowN(ctx, units...)
			require.ErrorIs(t, err, ErrInvalidSize, "%v", units)
		}
		require.ErrorIs(t, q.SetLimits(ctx, Limit{1, time.Hour}), ErrInvalidSize)
		assert.Equal(t, 0, b.num(t, "DBSIZE"), "nothing written")
	})
}

// A start takes from every limit or from none: refused by one limit, it
// takes nothing of the others.
func TestQuotaTakesFromAllOrNone(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		q, err := NewQuota(b.pool, "llm", []Limit{{N: 3, Per: time.Hour}, {N: 100, Per: time.Hour}})
		require.NoError(t, err)
		_, err = q.AllowN(ctx, 1, 60)
		require.NoError(t, err)
		_, err = q.AllowN(ctx, 1, 50)
		require.ErrorIs(t, err, ErrRateLimited, "tokens: 60+50 > 100")
		_, err = q.AllowN(ctx, 1, 40)
		require.NoError(t, err, "the refused start took no request")
		_, err = q.AllowN(ctx, 0, 1)
		require.ErrorIs(t, err, ErrRateLimited, "tokens used up")
		_, err = q.AllowN(ctx, 1, 0)
		require.NoError(t, err, "a start of requests only")
		_, err = q.AllowN(ctx, 1, 0)
		require.ErrorIs(t, err, ErrRateLimited, "requests used up")
		_, err = q.AllowN(ctx, 1, 101)
		var tl *TooLargeError
		require.ErrorAs(t, err, &tl)
		assert.Equal(t, 1, tl.Index)
		assert.Equal(t, Limit{N: 100, Per: time.Hour}, tl.Limit)
		assert.EqualError(t, err, `redsem: rate gate "llm": a start of 101 units can never pass its limit of 100 per 1h (its limit #2)`)

		st, err := q.Status(ctx)
		require.NoError(t, err)
		require.Len(t, st.Limits, 2)
		assert.Equal(t, LimitStatus{Limit: Limit{3, time.Hour}, Started: 3}, st.Limits[0])
		assert.Equal(t, LimitStatus{Limit: Limit{100, time.Hour}, Started: 100}, st.Limits[1])
		assert.Equal(t, 3, st.Started, "the first limit's")
		rs, err := ReadStatus(ctx, b.pool, DefaultPrefix, "llm")
		require.NoError(t, err)
		assert.Equal(t, st.Limits, rs.Limits, "ReadStatus needs no limits")
	})
}

// Waiters of a quota of two limits with different windows: every start
// holds to both, checked by the sliding-window checker on each limit.
func TestQuotaWaitNHoldsEveryLimit(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		req := Limit{N: 5, Per: 100 * time.Millisecond}
		tok := Limit{N: 40, Per: 300 * time.Millisecond}
		q, err := NewQuota(b.pool, "two", []Limit{req, tok})
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		var mu sync.Mutex
		var reqs, toks []redistest.Grant
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				units := []int{1, 3, 7, 15, 0}[w%5]
				r := 1
				if units == 0 {
					units, r = 2, 0 // a start of tokens only
				}
				for rctx.Err() == nil {
					st, err := q.WaitN(rctx, r, units)
					if err != nil {
						if rctx.Err() == nil {
							errs <- err
						}
						return
					}
					mu.Lock()
					reqs = append(reqs, redistest.Grant{At: st.At, Units: r})
					toks = append(toks, redistest.Grant{At: st.At, Units: units})
					if len(reqs) >= 60 {
						stop()
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		stop()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
		require.GreaterOrEqual(t, len(reqs), 60)
		assert.Empty(t, redistest.CheckWindows(reqs, []redistest.Rate{{N: req.N, Per: req.Per}}))
		assert.Empty(t, redistest.CheckWindows(toks, []redistest.Rate{{N: tok.N, Per: tok.Per}}))
		t.Logf("%s: %d starts; most in a window: %d of %d requests, %d of %d tokens", b.name, len(reqs),
			redistest.MaxUnitsInWindow(reqs, req.Per), req.N, redistest.MaxUnitsInWindow(toks, tok.Per), tok.N)
	})
}

// A weighted grant whose reply is lost while the caller's context ends is
// given back, every unit of every limit.
func TestLostWeightedGrantIsGivenBack(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		hp := &redistest.HookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
			if redistest.IsScript(engine.RateTake, cmd, args) {
				cancel()
				return redistest.ErrLostReply
			}
			return nil
		}}
		limits := []Limit{{N: 4, Per: time.Hour}, {N: 10, Per: time.Hour}}
		lost, err := NewQuota(hp, "lostn", limits)
		require.NoError(t, err)
		plain, err := NewQuota(b.pool, "lostn", limits)
		require.NoError(t, err)
		// The script must run (not fail with NOSCRIPT) for its reply to be lost.
		c := b.pool.Get()
		require.NoError(t, engine.RateTake.Load(c))
		c.Close()
		_, err = lost.WaitN(wctx, 3, 6)
		require.ErrorIs(t, err, context.Canceled)
		st, err := plain.Status(ctx)
		require.NoError(t, err)
		require.True(t, st.Exists, "the lost start ran")
		require.Eventually(t, func() bool {
			st, err := plain.Status(ctx)
			return err == nil && st.Limits[0].Started == 0 && st.Limits[1].Started == 0
		}, 10*time.Second, 10*time.Millisecond, "the start granted to the cancelled caller was given back")
		_, err = plain.AllowN(ctx, 4, 10)
		require.NoError(t, err, "the whole quota is free")
	})
}

// Giving back a lost grant that others were granted after keeps their
// windows: the running sums of the later grants move down.
func TestGivenBackGrantKeepsLaterOnes(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "refund", 10, time.Hour)
		acq := "0123456789abcdef0123456789abcdef"
		c := b.pool.Get()
		defer c.Close()
		r, err := parseRateReply(engine.RateTake.Do(c, g.q.takeCall(acq, 0, "fresh", []int{3}).KeysAndArgs...))
		require.NoError(t, err)
		require.Equal(t, int64(1), r.Code)
		later, err := g.AllowN(ctx, 5)
		require.NoError(t, err)
		r, err = (&takeUnits{q: g.q, units: []int{3}}).Abort(ctx, acq, "release")
		require.NoError(t, err)
		assert.Equal(t, int64(3), r.Code, "released")
		// 5 used: 5 more fit now, 6 only once the later grant leaves.
		_, err = g.AllowN(ctx, 5)
		require.NoError(t, err)
		st, err := g.AllowN(ctx, 1)
		require.ErrorIs(t, err, ErrRateLimited)
		assert.True(t, st.RetryAfter <= later.At.Add(time.Hour).Sub(later.At) && st.RetryAfter > time.Hour-time.Second,
			"the later grant's window is intact: retry after %v", st.RetryAfter)
		log, err := redis.Strings(b.do(t, "ZRANGE", g.q.k.logs[0], 0, -1, "WITHSCORES"), nil)
		require.NoError(t, err)
		require.Len(t, log, 4)
		assert.Equal(t, []string{"5", "10"}, []string{log[1], log[3]}, "running sums without the given-back 3")
	})
}

// A gate of the token layout (redsem v0.1.0) is upgraded by the first
// start: the old window counts as full until per after its last grant, and
// the old keys go.
func TestUpgradeFromTokenLayout(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		// The old window must still hold its units when Status reads it:
		// miniredis's clock stands still until the test moves it, and on
		// real Redis per is a second (300 ms were spent under load).
		if b.mini != nil {
			b.mini.SetTime(time.Now())
		}
		per := time.Second
		g := newGate(t, b, "old", 2, per)
		now, err := redis.Int64s(b.do(t, "TIME"), nil)
		require.NoError(t, err)
		last := now[0]*1e6 + now[1]
		base := g.q.k.base
		b.do(t, "HSET", base+"meta", "size", 2, "per", per.Microseconds(), "epoch", "0123456789ab", "fence", last, "rejected", 0)
		b.do(t, "RPUSH", base+"tokens", "0123456789ab:2")
		b.do(t, "ZADD", base+"leases", last+per.Microseconds(), "0123456789ab:1")
		b.do(t, "HSET", base+"holders", "t:0123456789ab:1", "acq|1", "a:acq", "0123456789ab:1")

		_, err = g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited, "the old window counts as full")
		st, err := g.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, st.Started, "the old window holds n units, no more")
		for _, k := range []string{"tokens", "leases"} {
			assert.Equal(t, 0, b.num(t, "EXISTS", base+k), "old %s left", k)
		}
		assert.Equal(t, 0, b.num(t, "HEXISTS", base+"meta", "epoch"))
		if b.mini != nil {
			b.mini.SetTime(time.UnixMicro(last).Add(per))
		} else {
			time.Sleep(per)
		}
		_, err = g.AllowN(ctx, 2)
		require.NoError(t, err, "the whole rate once per has passed")
	})
}

// A limit is written without Go's trailing zero units, as rate set takes it.
func TestLimit_String(t *testing.T) {
	t.Parallel()
	for l, want := range map[Limit]string{
		{10, time.Minute}: "10 per 1m", {3, time.Hour}: "3 per 1h", {7, 90 * time.Second}: "7 per 1m30s",
		{1, 90 * time.Minute}: "1 per 1h30m", {5, time.Second}: "5 per 1s", {20, 250 * time.Millisecond}: "20 per 250ms",
		{2, time.Hour + time.Second}: "2 per 1h0m1s",
	} {
		assert.Equal(t, want, l.String())
	}
}
