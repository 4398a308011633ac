package redsem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxInWindow is the sliding-window checker: the largest number of the times
// that fall in one half-open window [x, x+per), over every x. Sorted, that is
// the largest j-i+1 with t[j]-t[i] < per.
func maxInWindow(times []time.Time, per time.Duration) int {
	ts := append([]time.Time(nil), times...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	most, i := 0, 0
	for j := range ts {
		for ts[j].Sub(ts[i]) >= per {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

func TestRateGateCheckerSelf(t *testing.T) {
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, time.UnixMilli(int64(m)))
		}
		return ts
	}
	assert.Equal(t, 2, maxInWindow(at(0, 99, 100, 199), 100*time.Millisecond))
	assert.Equal(t, 3, maxInWindow(at(0, 50, 99, 100), 100*time.Millisecond))
	assert.Equal(t, 1, maxInWindow(at(0, 100, 200), 100*time.Millisecond))
	assert.Equal(t, 0, maxInWindow(nil, time.Second))
}

func newGate(t testing.TB, b *backend, name string, n int, per time.Duration, opts ...Option) *RateGate {
	t.Helper()
	g, err := NewRateGate(b.pool, name, n, per, opts...)
	require.NoError(t, err)
	return g
}

// rateKeysOf lists the keys of the gate in Redis.
func rateKeysOf(t testing.TB, b *backend, g *RateGate) []string {
	ks, err := redis.Strings(b.do(t, "KEYS", g.k.base+"*"), nil)
	require.NoError(t, err)
	sort.Strings(ks)
	return ks
}

// freeNow takes as many starts as Allow grants at once, up to limit.
func freeNow(ctx context.Context, t testing.TB, g *RateGate, limit int) int {
	for i := 0; i < limit; i++ {
		if _, err := g.Allow(ctx); err != nil {
			require.ErrorIs(t, err, ErrRateLimited)
			return i
		}
	}
	return limit
}

func TestRateGateBadInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, c := range []struct {
			n    int
			per  time.Duration
			opts []Option
			want error
		}{
			{0, time.Second, nil, ErrInvalidSize},
			{-3, time.Second, nil, ErrInvalidSize},
			{MaxSize + 1, time.Second, nil, ErrInvalidSize},
			{5, 0, nil, ErrInvalidInterval},
			{5, -time.Second, nil, ErrInvalidInterval},
			{5, 999 * time.Microsecond, nil, ErrInvalidInterval},
			{5, MaxTTL + time.Second, nil, ErrInvalidInterval},
			{5, time.Second, []Option{WithTTL(time.Minute)}, ErrInvalidOption},
			{5, time.Second, []Option{WithAutoRefresh()}, ErrInvalidOption},
			{5, time.Second, []Option{WithLabel("x")}, ErrInvalidOption},
			{5, time.Second, []Option{nil}, ErrInvalidOption},
			{5, time.Second, []Option{WithPrefix("a{b")}, ErrInvalidOption},
		} {
			g, err := NewRateGate(b.pool, "api", c.n, c.per, c.opts...)
			require.ErrorIs(t, err, c.want, "n=%d per=%v", c.n, c.per)
			assert.Nil(t, g)
		}
		_, err := NewRateGate(b.pool, "", 1, time.Second)
		require.ErrorIs(t, err, ErrInvalidName)
		_, err = NewRateGate(nil, "api", 1, time.Second)
		require.ErrorIs(t, err, ErrInvalidOption)
		assert.Equal(t, 0, b.keyCount(t), "constructors must not write")

		// A client that disagrees on n or per is refused; nothing changes.
		ctx := ctxT(t, 5*time.Second)
		g := newGate(t, b, "api", 3, time.Second)
		_, err = g.Allow(ctx)
		require.NoError(t, err)
		before := rateKeysOf(t, b, g)
		meta := b.do(t, "HGETALL", g.k.meta)
		for _, other := range []*RateGate{newGate(t, b, "api", 4, time.Second), newGate(t, b, "api", 3, 2*time.Second)} {
			_, err = other.Allow(ctx)
			var me *RateMismatchError
			require.ErrorAs(t, err, &me)
			require.ErrorIs(t, err, ErrRateMismatch)
			assert.Equal(t, 3, me.StoredN)
			assert.Equal(t, time.Second, me.StoredPer)
			_, err = other.Wait(ctx)
			require.ErrorIs(t, err, ErrRateMismatch)
		}
		assert.Equal(t, before, rateKeysOf(t, b, g))
		assert.Equal(t, meta, b.do(t, "HGETALL", g.k.meta))
		assert.Equal(t, 2, b.llen(t, g.k.tokens))
	})
}

func TestRateGateAllowAndRetryAfter(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 5*time.Second)
		per := 300 * time.Millisecond
		g := newGate(t, b, "partner", 3, per)
		var last Start
		for i := 0; i < 3; i++ {
			st, err := g.Allow(ctx)
			require.NoError(t, err)
			assert.True(t, st.At.After(last.At), "grant times increase")
			last = st
		}
		assert.Greater(t, last.RetryAfter, per/2, "the last free start reports when the next comes back")
		st, err := g.Allow(ctx)
		var rl *RateLimitedError
		require.ErrorAs(t, err, &rl)
		require.ErrorIs(t, err, ErrRateLimited)
		assert.True(t, rl.RetryAfter > 0 && rl.RetryAfter <= per, "retry after %v", rl.RetryAfter)
		assert.Equal(t, rl.RetryAfter, st.RetryAfter)
		assert.True(t, st.At.IsZero())

		time.Sleep(rl.RetryAfter + 5*time.Millisecond)
		_, err = g.Allow(ctx)
		require.NoError(t, err, "a start is possible once the retry-after has passed")

		// A Semaphore of the same name is another thing: no shared key.
		s := newSem(t, b, "partner", 1)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		for _, k := range rateKeysOf(t, b, g) {
			assert.Contains(t, k, "{partner}:rate:")
		}
		assert.Equal(t, 1, b.llen(t, s.k.tokens))
	})
}

// fixedWindow is the hand-made limiter people write: INCR a counter, give it
// a TTL of one window when it is new, allow while the count is at most n.
type fixedWindow struct {
	pool *redis.Pool
	key  string
	n    int
	per  time.Duration
}

func (f *fixedWindow) allow() (bool, error) {
	c := f.pool.Get()
	defer c.Close()
	v, err := redis.Int(c.Do("INCR", f.key))
	if err != nil {
		return false, err
	}
	if v == 1 {
		if _, err := c.Do("PEXPIRE", f.key, f.per.Milliseconds()); err != nil {
			return false, err
		}
	}
	return v <= f.n, nil
}

// The checker must be able to fail: a fixed-window limiter lets n through at
// the end of one window and n at the start of the next, 2n within a few
// milliseconds, and the checker must see it. The RateGate, driven the same
// way, must not let it happen.
func TestRateGateCheckerCatchesFixedWindowBurst(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const n = 5
		per := 200 * time.Millisecond
		ctx := ctxT(t, 5*time.Second)
		burst := func(allow func() (time.Time, bool)) []time.Time {
			var got []time.Time
			for i := 0; i < 2*n; i++ {
				if at, ok := allow(); ok {
					got = append(got, at)
				}
			}
			return got
		}

		fw := &fixedWindow{pool: b.pool, key: "fw", n: n, per: per}
		ok, err := fw.allow() // opens a window
		require.NoError(t, err)
		require.True(t, ok)
		opened := time.Now()
		time.Sleep(per - 30*time.Millisecond)
		naive := burst(func() (time.Time, bool) { ok, err := fw.allow(); return time.Now(), err == nil && ok })
		if b.mini != nil {
			// miniredis moves TTLs only when told: end the window now.
			time.Sleep(time.Until(opened.Add(per)))
			b.mini.FastForward(per)
		}
		for b.do(t, "EXISTS", "fw").(int64) == 1 && time.Since(opened) < 2*per {
			time.Sleep(time.Millisecond)
		}
		naive = append(naive, burst(func() (time.Time, bool) { ok, err := fw.allow(); return time.Now(), err == nil && ok })...)
		require.Len(t, naive, 2*n-1)
		assert.Greater(t, maxInWindow(naive, per), n, "the checker catches the fixed window's boundary burst")

		g := newGate(t, b, "boundary", n, per)
		first, err := g.Allow(ctx)
		require.NoError(t, err)
		time.Sleep(per - 30*time.Millisecond)
		gated := []time.Time{first.At}
		allow := func() (time.Time, bool) { st, err := g.Allow(ctx); return st.At, err == nil }
		gated = append(gated, burst(allow)...)
		time.Sleep(40 * time.Millisecond)
		gated = append(gated, burst(allow)...)
		assert.Equal(t, n+1, len(gated), "the first start came back; nothing else")
		assert.LessOrEqual(t, maxInWindow(gated, per), n)
	})
}

// The helper process: when REDSEM_RATE_HELPER is set, this test runs as a
// client of the gate the parent names, prints one line per start and exits.
func TestRateGateHelperProcess(t *testing.T) {
	if os.Getenv("REDSEM_RATE_HELPER") == "" {
		t.Skip("runs only as a helper process of the rate gate tests")
	}
	env := func(k string) int {
		v, err := strconv.Atoi(os.Getenv(k))
		require.NoError(t, err, k)
		return v
	}
	pool := &redis.Pool{MaxIdle: 64, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", os.Getenv("REDSEM_RATE_ADDR")) }}
	defer pool.Close()
	g, err := NewRateGate(pool, os.Getenv("REDSEM_RATE_NAME"), env("REDSEM_RATE_N"), time.Duration(env("REDSEM_RATE_PER_MS"))*time.Millisecond, WithGrace(200*time.Millisecond))
	require.NoError(t, err)
	mode := os.Getenv("REDSEM_RATE_HELPER")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(env("REDSEM_RATE_FOR_MS"))*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for range env("REDSEM_RATE_WORKERS") {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				st, err := g.Wait(ctx)
				now := time.Now()
				mu.Lock()
				if err == nil {
					fmt.Fprintf(out, "START %d %d\n", st.At.UnixMicro(), now.UnixMicro())
				} else if !errors.Is(err, context.DeadlineExceeded) {
					fmt.Fprintf(out, "ERROR %v\n", err)
				}
				out.Flush()
				mu.Unlock()
				if mode == "hold" && err == nil {
					<-ctx.Done() // the crash test: take starts, then wait to be killed
				}
			}
		}()
	}
	wg.Wait()
}

type helperRun struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

func startHelper(t *testing.T, b *backend, mode, name string, n int, per, dur time.Duration, workers int) *helperRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRateGateHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"REDSEM_RATE_HELPER="+mode, "REDSEM_RATE_ADDR="+b.addr, "REDSEM_RATE_NAME="+name,
		"REDSEM_RATE_N="+strconv.Itoa(n), "REDSEM_RATE_PER_MS="+strconv.Itoa(int(per.Milliseconds())),
		"REDSEM_RATE_FOR_MS="+strconv.Itoa(int(dur.Milliseconds())), "REDSEM_RATE_WORKERS="+strconv.Itoa(workers))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return &helperRun{cmd: cmd, out: bufio.NewScanner(stdout)}
}

// starts reads a helper's output up to n starts (n < 0: to the end) and
// returns grant times (Redis TIME) and the helper's clock when Wait returned.
func (h *helperRun) starts(n int) (grants, seen []time.Time, errs []string) {
	for (n < 0 || len(grants) < n) && h.out.Scan() {
		f := strings.Fields(h.out.Text())
		switch {
		case len(f) == 3 && f[0] == "START":
			g, _ := strconv.ParseInt(f[1], 10, 64)
			s, _ := strconv.ParseInt(f[2], 10, 64)
			grants, seen = append(grants, time.UnixMicro(g)), append(seen, time.UnixMicro(s))
		case len(f) > 0 && f[0] == "ERROR":
			errs = append(errs, h.out.Text())
		}
	}
	return grants, seen, errs
}

// Several processes share a gate under saturation. The sliding-window
// checker over every recorded start proves no window of length per held
// more than n (by Redis time, strictly; by the clients' own clocks, over
// windows shortened by the largest delay from grant to Wait's return), and
// throughput converges to n/per.
func TestRateGateProcessesSlidingWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const n, procs, workers = 8, 3, 6
		per := 200 * time.Millisecond
		dur := 1600 * time.Millisecond
		var hs []*helperRun
		for range procs {
			hs = append(hs, startHelper(t, b, "run", "shared-api", n, per, dur, workers))
		}
		var grants, seen []time.Time
		for _, h := range hs {
			g, s, errs := h.starts(-1)
			assert.Empty(t, errs)
			require.NoError(t, h.cmd.Wait())
			grants, seen = append(grants, g...), append(seen, s...)
		}
		require.NotEmpty(t, grants)
		assert.LessOrEqual(t, maxInWindow(grants, per), n, "n per window by Redis time")
		var delay time.Duration
		for i := range grants {
			delay = max(delay, seen[i].Sub(grants[i]))
		}
		if delay < per {
			assert.LessOrEqual(t, maxInWindow(seen, per-delay), n, "by the clients' clocks, windows of per-%v", delay)
		}
		sort.Slice(grants, func(i, j int) bool { return grants[i].Before(grants[j]) })
		span := grants[len(grants)-1].Sub(grants[0])
		// n start at once, then n per interval: the first n ride free.
		rate := float64(len(grants)-n) / span.Seconds()
		want := float64(n) / per.Seconds()
		t.Logf("%s: %d starts from %d processes x %d workers in %v: %.1f/s after the first burst (configured %.1f/s), max grant-to-return delay %v",
			b.name, len(grants), procs, workers, span.Round(time.Millisecond), rate, want, delay)
		assert.LessOrEqual(t, rate, want*1.001)
		assert.GreaterOrEqual(t, rate, want*0.85, "throughput converges to n/per")
	})
}

// 64 goroutines of one process saturate a gate: achieved rate against the
// configured one, and the jitter of the starts (gap between consecutive
// grants of one token, less per).
func TestRateGateThroughput64(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const n, workers = 20, 64
		per := 250 * time.Millisecond
		g := newGate(t, b, "saturated", n, per)
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		var mu sync.Mutex
		var grants []time.Time
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					st, err := g.Wait(ctx)
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							errs <- err
						}
						return
					}
					mu.Lock()
					grants = append(grants, st.At)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
		require.Greater(t, len(grants), n)
		assert.LessOrEqual(t, maxInWindow(grants, per), n)
		sort.Slice(grants, func(i, j int) bool { return grants[i].Before(grants[j]) })
		span := grants[len(grants)-1].Sub(grants[0])
		rate := float64(len(grants)-n) / span.Seconds()
		want := float64(n) / per.Seconds()
		// Grant i+n reuses the token of grant i at the earliest: its lateness
		// is the jitter a token return adds.
		var late []time.Duration
		for i := n; i < len(grants); i++ {
			late = append(late, grants[i].Sub(grants[i-n])-per)
		}
		sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
		t.Logf("%s: %d goroutines, %d per %v: %.1f starts/s (configured %.1f/s, %.1f%%); token reuse late by p50 %v p99 %v max %v",
			b.name, workers, n, per, rate, want, 100*rate/want,
			late[len(late)/2], late[len(late)*99/100], late[len(late)-1])
		assert.GreaterOrEqual(t, rate, want*0.85)
	})
}

// A client that crashes after taking starts loses nothing: each token comes
// back per after it was taken. A waiter that dies while it keeps time for
// the queue does not stall the others for long.
func TestRateGateCrashedClientLosesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const n = 4
		per := 300 * time.Millisecond
		ctx := ctxT(t, 10*time.Second)
		h := startHelper(t, b, "hold", "crash", n, per, 10*time.Second, n)
		grants, _, errs := h.starts(n)
		require.Empty(t, errs)
		require.Len(t, grants, n)
		require.NoError(t, h.cmd.Process.Signal(syscall.SIGKILL))
		_ = h.cmd.Wait()

		g := newGate(t, b, "crash", n, per, WithGrace(200*time.Millisecond))
		var mine []time.Time
		for range n {
			st, err := g.Wait(ctx)
			require.NoError(t, err)
			mine = append(mine, st.At)
		}
		latest := grants[0]
		for _, at := range grants {
			latest = maxTime(latest, at)
		}
		for _, at := range mine {
			assert.False(t, at.Before(grants[0].Add(per)), "no token came back early")
			assert.True(t, at.Before(latest.Add(per+150*time.Millisecond)), "every token came back about per after it was taken: %v", at.Sub(latest))
		}
		assert.LessOrEqual(t, maxInWindow(append(grants, mine...), per), n)

		// Now a waiter that keeps time for the queue dies: queue it by hand
		// on a connection that then closes, as a killed process's would.
		conn, err := b.pool.GetContext(ctx)
		require.NoError(t, err)
		acq := newAcqID()
		r, err := parseRateReply(rateTakeScript.Do(conn, g.takeArgs(acq, (10*time.Second).Microseconds(), "fresh")...))
		require.NoError(t, err)
		require.Equal(t, int64(0), r.code)
		require.True(t, r.head, "the dead waiter is the head of the queue")
		conn.Close()
		began := time.Now()
		st, err := g.Wait(ctx)
		require.NoError(t, err)
		// Its own timer plus the grace tell others it is dead; the next
		// waiter wakes within max(per, 1s) to notice.
		assert.Less(t, time.Since(began), per+200*time.Millisecond+time.Second+500*time.Millisecond, "waited %v", st.Waited)
	})
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Cancelled waiters lose nothing: many waiters give up, some right as tokens
// come back; afterwards every token is free again and the queue is empty.
func TestRateGateCancelledWaitersLoseNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const n = 3
		per := 200 * time.Millisecond
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "cancel", n, per)
		require.Equal(t, n, freeNow(ctx, t, g, n+1))

		var wg sync.WaitGroup
		results := make(chan error, 24)
		for i := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Deadlines spread around the moment the tokens come back.
				wctx, cancel := context.WithTimeout(ctx, per-40*time.Millisecond+time.Duration(i*4)*time.Millisecond)
				defer cancel()
				_, err := g.Wait(wctx)
				results <- err
			}()
		}
		wg.Wait()
		close(results)
		granted := 0
		for err := range results {
			if err == nil {
				granted++
				continue
			}
			assert.ErrorIs(t, err, context.DeadlineExceeded)
		}
		assert.LessOrEqual(t, granted, n)

		// Every token is back within per of the last grant.
		time.Sleep(per + 20*time.Millisecond)
		assert.Equal(t, n, freeNow(ctx, t, g, n+1), "all %d starts are free again (%d went to waiters)", n, granted)
		assert.Equal(t, 0, b.llen(t, g.k.base+"queue"), "nobody left in the queue")
		ks := rateKeysOf(t, b, g)
		for _, k := range ks {
			assert.NotContains(t, k, ":rate:in:", "no doorbell left")
		}
	})
}

// A grant whose reply is lost while the caller's context ends is given back:
// the caller never started, so the gate does not count it.
func TestRateGateLostGrantOfCancelledWaiterIsGivenBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 5*time.Second)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		hp := &hookPool{Pool: b.pool, afterDo: func(cmd string, args []interface{}) error {
			if isScript(rateTakeScript, cmd, args) {
				cancel()
				return errLostReply
			}
			return nil
		}}
		g, err := NewRateGate(hp, "lost", 1, time.Hour)
		require.NoError(t, err)
		_, err = g.Wait(wctx)
		require.ErrorIs(t, err, context.Canceled)
		plain := newGate(t, b, "lost", 1, time.Hour)
		_, err = plain.Allow(ctx)
		require.NoError(t, err, "the start granted to the cancelled caller was given back")

		// Without cancellation the lost reply is resolved: the grant is kept.
		hp2 := &hookPool{Pool: b.pool}
		var once sync.Once
		hp2.afterDo = func(cmd string, args []interface{}) error {
			var e error
			if isScript(rateTakeScript, cmd, args) {
				once.Do(func() { e = errLostReply })
			}
			return e
		}
		g2, err := NewRateGate(hp2, "lost2", 2, time.Hour)
		require.NoError(t, err)
		st, err := g2.Wait(ctx)
		require.NoError(t, err)
		assert.False(t, st.At.IsZero())
		other := newGate(t, b, "lost2", 2, time.Hour)
		assert.Equal(t, 1, freeNow(ctx, t, other, 3), "one start used, not two")
	})
}

// Waiters are served first come, first served.
func TestRateGateFIFO(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		per := 150 * time.Millisecond
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "fifo", 1, per)
		_, err := g.Allow(ctx)
		require.NoError(t, err)
		order := make(chan int, 5)
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := g.Wait(ctx); err == nil {
					order <- i
				}
			}()
			// Let waiter i queue before waiter i+1 arrives.
			require.Eventually(t, func() bool { return b.llen(t, g.k.base+"queue") == i+1 }, time.Second, time.Millisecond)
		}
		wg.Wait()
		close(order)
		var got []int
		for i := range order {
			got = append(got, i)
		}
		assert.Equal(t, []int{0, 1, 2, 3, 4}, got)
	})
}

// The Gate keeps both limits: at most C in flight and at most n starts per
// interval; a cancelled Acquire holds nothing.
func TestGateInFlightAndRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const inflight, n = 2, 4
		per := 200 * time.Millisecond
		ctx := ctxT(t, 10*time.Second)
		sem := newSem(t, b, "api", inflight)
		rate := newGate(t, b, "api", n, per)
		gate, err := NewGate(sem, rate)
		require.NoError(t, err)
		_, err = NewGate(nil, rate)
		require.ErrorIs(t, err, ErrInvalidOption)

		var mu sync.Mutex
		var running, most int
		var starts []time.Time
		errs := make(chan error, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2 {
					l, err := gate.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					running++
					most = max(most, running)
					starts = append(starts, l.Start.At)
					mu.Unlock()
					time.Sleep(15 * time.Millisecond)
					mu.Lock()
					running--
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
		assert.Equal(t, inflight, most)
		assert.Len(t, starts, 16)
		assert.LessOrEqual(t, maxInWindow(starts, per), n)
		requireInventory(t, sem, inflight, 0)

		// The rate is spent: a cancelled Acquire gives its slot back, and
		// TryAcquire says when to retry.
		for freeNow(ctx, t, rate, n) > 0 {
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		_, err = gate.Acquire(cctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireInventory(t, sem, inflight, 0)
		_, err = gate.TryAcquire(ctx)
		var rl *RateLimitedError
		require.ErrorAs(t, err, &rl)
		assert.Greater(t, rl.RetryAfter, time.Duration(0))
		requireInventory(t, sem, inflight, 0)
		var nilLease *GateLease
		assert.ErrorIs(t, nilLease.Release(ctx), ErrLeaseLost)
		assert.True(t, errors.Is(err, ErrRateLimited))
	})
}
