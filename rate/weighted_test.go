package rate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// AllowN takes n units at once, and a start's RetryAfter says exactly when
// as many units fit again: at the end of the window of the grant whose
// leaving frees enough.
func TestAllowNRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		per := time.Hour // nothing leaves the window while this runs
		g := newGate(t, b, "units", 10, per)
		a, err := g.AllowN(ctx, 4)
		require.NoError(t, err)
		assert.Zero(t, a.RetryAfter, "4 more fit")
		c, err := g.AllowN(ctx, 5)
		require.NoError(t, err)
		// 9 used: 5 more fit once a's 4 leave.
		assert.Equal(t, a.At.Add(per).Sub(c.At), c.RetryAfter)
		d, err := g.AllowN(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, a.At.Add(per).Sub(d.At), d.RetryAfter, "1 more fits once a leaves")

		// 10 used: 7 fit once a (4) and c (5) have left.
		st, err := g.AllowN(ctx, 7)
		var le *LimitedError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, ErrRateLimited)
		assert.Equal(t, le.RetryAfter, st.RetryAfter)
		want := c.At.Add(per).Sub(d.At)
		assert.True(t, le.RetryAfter <= want && le.RetryAfter > want-time.Second, "retry after %v, want just under %v", le.RetryAfter, want)

		s, err := g.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 10, s.Started)
		assert.Equal(t, 0, s.Available)
		assert.Equal(t, []LimitStatus{{Limit: Limit{N: 10, Per: per}, Started: 10}}, s.Limits)
	})
}

// A start larger than the whole quota fails at once with ErrTooLarge and
// writes nothing; bad unit counts fail before any I/O.
func TestTooLargeFailsAtOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "big", 10, time.Hour)
		for _, call := range []func() (Start, error){
			func() (Start, error) { return g.AllowN(ctx, 11) },
			func() (Start, error) { return g.WaitN(ctx, 11) },
		} {
			_, err := call() // a wait would end with ctx, not ErrTooLarge
			var tl *TooLargeError
			require.ErrorAs(t, err, &tl)
			require.ErrorIs(t, err, ErrTooLarge)
			assert.Equal(t, TooLargeError{Name: "big", Index: 0, Units: 11, Limit: Limit{N: 10, Per: time.Hour}}, *tl)
			// The message names the limit, not its index among one.
			assert.EqualError(t, err, `redsem: rate gate "big": a start of 11 units can never pass its limit of 10 per 1h`)
		}
		assert.Equal(t, 0, b.num(t, "DBSIZE"), "a refused start creates nothing")
		for _, n := range []int{0, -1, MaxN + 1} {
			_, err := g.AllowN(ctx, n)
			require.ErrorIs(t, err, ErrInvalidSize, "n=%d", n)
		}
		_, err := g.AllowN(ctx, 10)
		require.NoError(t, err, "the whole quota at once")
	})
}

// A large request at the head of the queue is not overtaken by small ones
// behind it, though units come back one at a time and each would fit a
// small one.
func TestWaitNLargeHeadIsNotOvertaken(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const n = 6
		// Long enough that no unit comes back before the four waiters
		// queue (a loaded machine took more than 400 ms): then the large
		// one would go at once, before the queue the test waits for forms.
		per := 2 * time.Second
		ctx := ctxT(t, 20*time.Second)
		g := newGate(t, b, "fifo-n", n, per)
		// Fill the window with starts of one unit, 20ms apart: they leave it
		// one by one.
		for i := 0; i < n; i++ {
			_, err := g.WaitN(ctx, 1)
			require.NoError(t, err)
			time.Sleep(20 * time.Millisecond)
		}
		type got struct {
			who string
			at  time.Time
			err error
		}
		out := make(chan got, 4)
		var wg sync.WaitGroup
		waiter := func(who string, units int) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := g.WaitN(ctx, units)
				out <- got{who, st.At, err}
			}()
		}
		queued := func(k int) {
			require.Eventually(t, func() bool { return b.num(t, "LLEN", g.q.k.queue) == k }, 5*time.Second, time.Millisecond)
		}
		waiter("large", n-1)
		queued(1)
		for i, who := range []string{"small1", "small2", "small3"} {
			waiter(who, 1)
			queued(i + 2)
		}
		wg.Wait()
		close(out)
		at := map[string]time.Time{}
		for r := range out {
			require.NoError(t, r.err, r.who)
			at[r.who] = r.at
		}
		for _, who := range []string{"small1", "small2", "small3"} {
			assert.True(t, at["large"].Before(at[who]), "%s at %v went before the large head at %v", who, at[who], at["large"])
		}
	})
}

// A waiter whose request a lowered rate can never admit fails at once with
// ErrTooLarge; a raised rate wakes a waiter at once.
func TestSetRateRetimesWaiters(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		g := newGate(t, b, "retime", 10, time.Hour)
		_, err := g.AllowN(ctx, 10)
		require.NoError(t, err)

		errs := make(chan error, 1)
		go func() { _, err := g.WaitN(ctx, 8); errs <- err }()
		require.Eventually(t, func() bool { return b.num(t, "LLEN", g.q.k.queue) == 1 }, 5*time.Second, time.Millisecond)
		require.NoError(t, g.SetRate(ctx, 5, time.Hour))
		select {
		case err := <-errs:
			var tl *TooLargeError
			require.ErrorAs(t, err, &tl)
			assert.Equal(t, Limit{N: 5, Per: time.Hour}, tl.Limit)
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter did not learn that a lowered rate can never admit it")
		}
		assert.Equal(t, 0, b.num(t, "LLEN", g.q.k.queue))

		// Raised: 10 units in the window, 12 allowed, a waiter for 2 is
		// served by the change itself.
		got := make(chan Start, 1)
		go func() {
			st, err := g.WaitN(ctx, 2)
			errs <- err
			got <- st
		}()
		require.Eventually(t, func() bool { return b.num(t, "LLEN", g.q.k.queue) == 1 }, 5*time.Second, time.Millisecond)
		began := time.Now()
		require.NoError(t, g.SetRate(ctx, 12, time.Hour))
		select {
		case err := <-errs:
			require.NoError(t, err)
			t.Logf("%s: served %v after the change", b.name, time.Since(began))
		case <-time.After(5 * time.Second):
			t.Fatal("a raised rate did not wake the waiter")
		}
		st, err := g.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 12, st.Started)
		assert.True(t, st.Set)
		assert.False(t, st.Changed.IsZero())
		assert.False(t, (<-got).At.Before(st.Changed), "granted under the new rate")
	})
}

// Until SetRate writes the rate, a client that disagrees is refused; after,
// every client follows the stored rate, whatever it was made with.
func TestSetRateIsAdoptedByEveryClient(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		made := newGate(t, b, "adopt", 3, time.Hour)
		other := newGate(t, b, "adopt", 4, time.Hour)
		_, err := made.Allow(ctx)
		require.NoError(t, err)
		_, err = other.Allow(ctx)
		require.ErrorIs(t, err, ErrRateMismatch, "a configuration mistake is reported")

		require.NoError(t, other.SetRate(ctx, 5, time.Hour))
		for _, g := range []*Gate{made, other, newGate(t, b, "adopt", 7, time.Minute)} {
			_, err := g.Allow(ctx)
			require.NoError(t, err, "made with %v", g.q.limits)
		}
		_, err = made.AllowN(ctx, 3)
		require.ErrorIs(t, err, ErrRateLimited, "4 of 5 taken")
		_, err = made.AllowN(ctx, 6)
		require.ErrorIs(t, err, ErrTooLarge, "checked against the stored n")
		n, per := made.Limit()
		assert.Equal(t, 3, n, "Limit is the client's own")
		assert.Equal(t, time.Hour, per)

		// A quota of two limits is never the same as a gate of one.
		q, err := NewQuota(b.pool, "adopt", []Limit{{5, time.Hour}, {5, time.Hour}})
		require.NoError(t, err)
		_, err = q.AllowN(ctx, 1, 1)
		var me *MismatchError
		require.ErrorAs(t, err, &me)
		assert.Equal(t, []Limit{{5, time.Hour}}, me.Stored)
		require.ErrorIs(t, q.SetLimits(ctx, Limit{5, time.Hour}, Limit{5, time.Hour}), ErrRateMismatch)
	})
}

// SetRate on a gate nobody used creates it, already set.
func TestSetRateCreates(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "fresh", 3, time.Hour)
		require.NoError(t, g.SetRate(ctx, 2, time.Hour))
		require.NoError(t, g.SetRate(ctx, 2, time.Hour), "again: nothing changes")
		st, err := g.Status(ctx)
		require.NoError(t, err)
		assert.True(t, st.Exists)
		assert.True(t, st.Set)
		assert.Equal(t, 2, st.Limit)
		assert.Equal(t, 2, st.Available)
		for _, bad := range [][2]int64{{0, 1000}, {MaxN + 1, 1000}, {1, 0}} {
			err := g.SetRate(ctx, int(bad[0]), time.Duration(bad[1])*time.Millisecond)
			assert.Error(t, err, "%v", bad)
		}
	})
}

// Goroutines take starts of mixed sizes while the rate changes under them:
// raised, lowered, per shortened and lengthened. Every start holds to the
// rate in force at its grant time over that rate's window (CheckWindows),
// and the starts go on across every change.
func TestSetRateRuleHoldsAcrossChanges(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 60*time.Second)
		first := Limit{N: 12, Per: 200 * time.Millisecond}
		g := newGate(t, b, "changes", first.N, first.Per)
		rates := []redistest.Rate{{N: first.N, Per: first.Per}}
		changes := []Limit{
			{N: 20, Per: 200 * time.Millisecond}, // raised
			{N: 6, Per: 200 * time.Millisecond},  // lowered
			{N: 6, Per: 100 * time.Millisecond},  // shorter
			{N: 10, Per: 400 * time.Millisecond}, // longer
			{N: 12, Per: 150 * time.Millisecond},
		}
		rctx, stop := context.WithCancel(ctx)
		var mu sync.Mutex
		var grants []redistest.Grant
		errs := make(chan error, 16)
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				units := 1 + w%4 // 1..4: fits every rate above
				for rctx.Err() == nil {
					st, err := g.WaitN(rctx, units)
					if err != nil {
						if rctx.Err() == nil {
							errs <- err
						}
						return
					}
					mu.Lock()
					grants = append(grants, redistest.Grant{At: st.At, Units: units})
					mu.Unlock()
				}
			}()
		}
		count := func() int { mu.Lock(); defer mu.Unlock(); return len(grants) }
		for _, c := range changes {
			// Let starts run under each rate: at least a few grants.
			before := count()
			require.Eventually(t, func() bool { return count() >= before+8 }, 20*time.Second, time.Millisecond)
			at, err := g.q.setLimits(ctx, []Limit{c})
			require.NoError(t, err)
			rates = append(rates, redistest.Rate{At: at, N: c.N, Per: c.Per})
		}
		before := count()
		require.Eventually(t, func() bool { return count() >= before+8 }, 20*time.Second, time.Millisecond)
		stop()
		wg.Wait()
		close(errs)
		for err := range errs {
			assert.NoError(t, err)
		}
		v := redistest.CheckWindows(grants, rates)
		for _, x := range v {
			t.Errorf("window over the rate in force: %s", x)
		}
		t.Logf("%s: %d starts across %d rate changes, no window over the rate in force", b.name, len(grants), len(changes))
	})
}

// Lengthening per counts the grants that had already left the old window:
// a gate run at its full 10 per 100ms for 0.5s, quiet for 150ms and then
// lengthened to 10 per second holds about 50 units in the new window, so it
// admits nothing until the grants before the change are a second old.
func TestSetRateLongerPerCountsForgottenGrants(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		old := Limit{N: 10, Per: 100 * time.Millisecond}
		g := newGate(t, b, "longer", old.N, old.Per)
		var grants []redistest.Grant
		// More than 10 grants in the 600ms before the last (server time),
		// so that the new window of a second holds more than 10 after the
		// quiet 150ms and the change. 0.5s at full rate gives about 50; a
		// loaded machine's slower loop runs on until it has them.
		recent := func() int {
			n := 0
			for _, gr := range grants {
				if gr.At.After(grants[len(grants)-1].At.Add(-600 * time.Millisecond)) {
					n++
				}
			}
			return n
		}
		begin := time.Now()
		for time.Since(begin) < 500*time.Millisecond || recent() <= 10 {
			st, err := g.Wait(ctx)
			require.NoError(t, err)
			grants = append(grants, redistest.Grant{At: st.At, Units: 1})
		}
		time.Sleep(150 * time.Millisecond) // the old window is empty
		long := Limit{N: 10, Per: time.Second}
		at, err := g.q.setLimits(ctx, []Limit{long})
		require.NoError(t, err)

		st, err := g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited, "the new window already holds more than 10")
		assert.True(t, st.RetryAfter > 0 && st.RetryAfter <= long.Per-old.Per,
			"retry after %v: no later than per'-per after the change", st.RetryAfter)
		s, err := g.Status(ctx)
		require.NoError(t, err)
		assert.Zero(t, s.Available)

		// Starts resume once the change is per'-per old, and hold the plain
		// rule (CheckWindows) throughout.
		for len(grants) < 60 {
			st, err := g.Wait(ctx)
			require.NoError(t, err)
			grants = append(grants, redistest.Grant{At: st.At, Units: 1})
			if st.At.After(at) {
				assert.False(t, st.At.Before(at.Add(long.Per-old.Per-time.Millisecond)),
					"a start %v after the change", st.At.Sub(at))
				if st.At.After(at.Add(long.Per)) {
					break
				}
			}
		}
		rates := []redistest.Rate{{N: old.N, Per: old.Per}, {At: at, N: long.N, Per: long.Per}}
		for _, v := range redistest.CheckWindows(grants, rates) {
			t.Errorf("window over the rate in force: %s", v)
		}
	})
}

// A start granted before per lengthened, which its waiter gives back
// unused, keeps its units in the window while the made-up grant stands for
// what the gate forgot (it was sized with them): taken out, they would let
// a new start share the new window with a start the gate forgot.
func TestSetRateLongerPerGivenBackStartKeepsItsUnits(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		// A long grace: a loaded machine's pause must not let the waiter
		// below count as dead before it is served.
		g := newGate(t, b, "givenback", 2, 200*time.Millisecond, WithGrace(time.Minute))
		_, err := g.Allow(ctx) // the start the change will have forgotten
		require.NoError(t, err)
		conn, err := b.pool.GetContext(ctx)
		require.NoError(t, err)
		defer conn.Close()
		acq := "00112233445566778899aabbccddeeff"
		r, err := parseRateReply(engine.RunScript(ctx, conn, g.q.takeCall(acq, (10*time.Second).Microseconds(), "fresh", []int{2})))
		require.NoError(t, err)
		require.EqualValues(t, engine.CodeWaiting, r.Code, "2 units wait behind the first start")
		// Once the first start has left its window, the next script grants
		// the waiter its 2 units (it has not collected them), and Allow
		// finds the window full.
		time.Sleep(250 * time.Millisecond)
		_, err = g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited)
		// Per grows: the first start is forgotten, and the waiter's 2 units
		// already fill the new n of 1, so the made-up grant takes none.
		require.NoError(t, g.SetRate(ctx, 1, time.Minute))
		_, err = parseRateReply(engine.RunScript(ctx, conn, engine.RateAbort.With(g.q.k.args(acq),
			engine.RateAbortArgs{AcqID: acq, Mode: "release", TombUs: g.q.tomb().Microseconds()})))
		require.NoError(t, err)
		_, err = g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited, "the first start is within the new minute")
	})
}

// A gate younger than the old per has forgotten nothing: lengthening per
// keeps admitting what the new window has room for.
func TestSetRateLongerPerOnYoungGate(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "young", 10, time.Minute)
		_, err := g.AllowN(ctx, 3)
		require.NoError(t, err)
		require.NoError(t, g.SetRate(ctx, 10, time.Hour))
		_, err = g.AllowN(ctx, 7)
		require.NoError(t, err, "7 more fit in the hour")
		_, err = g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited)
	})
}

// The made-up grant that lengthening per adds stays the window's floor
// through later changes: raising n while it is in the window tops it up,
// so that nothing is admitted until it leaves (h + per), as if the
// forgotten grants had taken the new n.
func TestSetRateLongerPerThenMoreStillCountsForgottenGrants(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "longer-then-more", 2, 100*time.Millisecond)
		for range 2 {
			_, err := g.Allow(ctx)
			require.NoError(t, err)
		}
		time.Sleep(150 * time.Millisecond) // the old window is empty
		require.NoError(t, g.SetRate(ctx, 2, 5*time.Second))
		_, err := g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited, "the forgotten 2 fill the new window")
		require.NoError(t, g.SetRate(ctx, 4, 5*time.Second))
		_, err = g.Allow(ctx)
		require.ErrorIs(t, err, ErrRateLimited, "the forgotten grants count as the new n")
	})
}

// A change that does not lengthen per (n alone, or a shorter per) makes up
// no forgotten grants: an empty window admits the new n at once.
func TestSetRateNotLongerMakesUpNothing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newGate(t, b, "not-longer", 2, 100*time.Millisecond)
		_, err := g.AllowN(ctx, 2)
		require.NoError(t, err)
		time.Sleep(150 * time.Millisecond) // the window is empty
		require.NoError(t, g.SetRate(ctx, 3, 100*time.Millisecond))
		st, err := g.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, [2]int{0, 3}, [2]int{st.Due, st.Available}, "n alone: nothing in the window")
		_, err = g.AllowN(ctx, 3)
		require.NoError(t, err, "n alone")
		time.Sleep(150 * time.Millisecond)
		require.NoError(t, g.SetRate(ctx, 3, 50*time.Millisecond))
		_, err = g.AllowN(ctx, 3)
		require.NoError(t, err, "a shorter per")
	})
}
