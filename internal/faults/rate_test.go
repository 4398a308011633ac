package faults

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// Rate gates under faults: rateworker processes take starts of mixed sizes
// from a quota of two limits while the test changes the limits, cancels,
// and kills them (kill -9 from outside, and at the acquisition's
// failpoints from inside). The sliding-window checker holds every start
// to the limits in force at its grant time (redistest.CheckWindows), and
// the whole quota must be free again soon after the last client is gone.
// The two tests after it run the same checker on deliberately broken gates
// and must see it fail.

// newRateRun is a run of rateworker processes on the quota limits.
func newRateRun(t *testing.T, srv *redistest.Server, limits []rate.Limit, extra ...string) *run {
	r := &run{t: t, srv: srv, bin: rateWorkerBin, hist: filepath.Join(t.TempDir(), "history.jsonl"),
		name: "faults-" + t.Name()}
	var fs []string
	for _, l := range limits {
		fs = append(fs, fmt.Sprintf("%d/%v", l.N, l.Per))
	}
	r.base = append([]string{"-addr", srv.Addr, "-hist", r.hist, "-name", r.name, "-limits", strings.Join(fs, ",")}, extra...)
	t.Cleanup(r.stopAll)
	return r
}

// quota is the run's quota for the test's own use.
func (r *run) quota(limits []rate.Limit) *rate.Quota {
	q, err := rate.NewQuota(r.pool(), r.name, limits, rate.WithGrace(200*time.Millisecond))
	require.NoError(r.t, err)
	return q
}

// change applies limits with SetLimits and returns the rate of each limit
// from then on, at the change's Redis time (Status.Changed).
func change(t *testing.T, q *rate.Quota, limits []rate.Limit) []redistest.Rate {
	ctx := ctxT(t, 5*time.Second)
	require.NoError(t, q.SetLimits(ctx, limits...))
	st, err := q.Status(ctx)
	require.NoError(t, err)
	out := make([]redistest.Rate, len(limits))
	for i, l := range limits {
		out[i] = redistest.Rate{At: st.Changed, N: l.N, Per: l.Per}
	}
	return out
}

// windowViolations holds the starts in the history to rates (rates[i] is
// limit i's history of rates) and returns what the checker found, limit by
// limit, and how many starts there were.
func windowViolations(t *testing.T, evs []history.Event, rates [][]redistest.Rate) ([][]redistest.WindowViolation, int) {
	grants := make([][]redistest.Grant, len(rates))
	starts := 0
	for _, e := range evs {
		if e.K != history.KStart {
			continue
		}
		starts++
		require.Len(t, e.Units, len(rates))
		for i, u := range e.Units {
			grants[i] = append(grants[i], redistest.Grant{At: time.UnixMicro(e.T), Units: u})
		}
	}
	out := make([][]redistest.WindowViolation, len(rates))
	for i := range rates {
		out[i] = redistest.CheckWindows(grants[i], rates[i])
	}
	return out, starts
}

func TestRateQuotaUnderKillsCancelsAndChanges(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	initial := []rate.Limit{{N: 6, Per: 200 * time.Millisecond}, {N: 60, Per: 300 * time.Millisecond}}
	// Every unit vector fits every rate below: at most 2 requests, 20 tokens.
	r := newRateRun(t, srv, initial, "-units", "1:1,1:5,1:12,0:8,1:20,2:0", "-goroutines", "3")
	q := r.quota(initial)
	changes := [][]rate.Limit{
		{{N: 10, Per: 200 * time.Millisecond}, {N: 90, Per: 300 * time.Millisecond}}, // raised
		{{N: 4, Per: 200 * time.Millisecond}, {N: 40, Per: 300 * time.Millisecond}},  // lowered
		{{N: 4, Per: 100 * time.Millisecond}, {N: 40, Per: 150 * time.Millisecond}},  // shorter
		{{N: 6, Per: 400 * time.Millisecond}, {N: 60, Per: 500 * time.Millisecond}},  // longer
		{{N: 8, Per: 200 * time.Millisecond}, {N: 50, Per: 300 * time.Millisecond}},
	}
	rates := [][]redistest.Rate{{{N: initial[0].N, Per: initial[0].Per}}, {{N: initial[1].N, Per: initial[1].Per}}}

	runFor := scaled(5*time.Second, 6)
	end := time.Now().Add(runFor)
	spawn := func(i int) *proc {
		args := []string{"-dur", time.Until(end).Round(time.Millisecond).String()}
		switch i % 3 {
		case 0:
			// The first dies at a failpoint almost surely (a loaded machine
			// may run too few starts for 0.02 to hit): the check below
			// then never depends on luck.
			killp := "0.02"
			if i == 0 {
				killp = "0.5"
			}
			args = append(args, "-killp", killp)
		case 1:
			args = append(args, "-cancelp", "0.3", "-allowp", "0.2")
		}
		return r.spawn(args...)
	}
	live := map[*proc]bool{}
	for i := 0; i < 4; i++ {
		live[spawn(i)] = true
	}
	kills, spawned, last := 0, 4, initial
	for i := 0; time.Now().Before(end.Add(-400 * time.Millisecond)); i++ {
		time.Sleep(time.Duration(200+rand.IntN(200)) * time.Millisecond)
		for p := range live {
			if p.exited() { // killed itself at a failpoint
				delete(live, p)
				live[spawn(spawned)] = true
				spawned++
			}
		}
		if i%2 == 0 {
			last = changes[(i/2)%len(changes)]
			for l, rt := range change(t, q, last) {
				rates[l] = append(rates[l], rt)
			}
		} else {
			for p := range live { // a random victim
				p.kill9()
				kills++
				delete(live, p)
				live[spawn(spawned)] = true
				spawned++
				break
			}
		}
	}
	r.waitAll(30 * time.Second)
	gone := time.Now()
	evs := r.events()
	violations, starts := windowViolations(t, evs, rates)
	for i, vs := range violations {
		for _, v := range vs {
			t.Errorf("limit %d: %s", i+1, v)
		}
	}
	fpkills := count(evs, history.KFPKill, nil)
	cancels := count(evs, history.KCancel, nil)
	assert.Positive(t, starts, "no starts")
	assert.Positive(t, fpkills, "no client died at a failpoint")
	assert.Positive(t, cancels, "no wait was cancelled")
	assert.Zero(t, count(evs, history.KFatal, nil), "a worker failed")

	// Nothing is lost for longer than a window: once the last client is
	// gone, the whole quota is free within the longest per (a grant's units
	// leave then) or, for a dead waiter still queued, its liveness (at most
	// max(per, 1s) plus the grace) on a machine with time to spare: logged,
	// while never is what fails.
	ctx := ctxT(t, 20*time.Second)
	full := []int{last[0].N, last[1].N}
	bound := max(last[0].Per, last[1].Per, time.Second) + 200*time.Millisecond + time.Second
	var err error
	for {
		if _, err = q.AllowN(ctx, full...); err == nil || time.Since(gone) > 3*bound {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(gone)
	require.NoError(t, err, "the whole quota never came back")
	t.Logf("the whole quota came back %v after the last client went (bound %v)", took, bound)
	// A killed waiter that was served stays registered (its reply "on its
	// way") until its liveness deadline: within the same bound.
	var st rate.Status
	for {
		st, err = q.Status(ctx)
		require.NoError(t, err)
		if st.Waiting == 0 || time.Since(gone) > bound {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.Zero(t, st.Waiting, "dead waiters still registered %v after the last client", time.Since(gone))
	assert.Zero(t, st.Stray)
	t.Logf("%d starts by %d clients (%d kill -9, %d failpoint self-kills, %d cancelled waits), %d rate changes: no window over the rate in force; whole quota free %v after the last client",
		starts, spawned, kills, fpkills, cancels, len(rates[0])-1, took.Round(time.Millisecond))
}

// TestRateCheckerCatchesResetOnChange: a gate whose rate change forgets the
// window (as Redisson's setRate resets its limiter) admits a second full
// window at once after each change. The checker must see a window over the
// rate in force.
func TestRateCheckerCatchesResetOnChange(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	initial := []rate.Limit{{N: 8, Per: 300 * time.Millisecond}}
	r := newRateRun(t, srv, initial, "-units", "1,2,3", "-goroutines", "3", "-dur", "3s")
	q := r.quota(initial)
	for i := 0; i < 3; i++ {
		r.spawn()
	}
	rates := [][]redistest.Rate{{{N: 8, Per: 300 * time.Millisecond}}}
	base := "redsem:{" + history.EncodeName(r.name) + "}:rate:"
	for i := 0; i < 6; i++ {
		time.Sleep(400 * time.Millisecond)
		// The broken part: forget every grant in the window, then change
		// the rate. The change re-times the waiters by the emptied window,
		// so those queued start at once, while the grants just forgotten
		// are still in the window the checker counts. (Forgetting after the
		// change left the waiters asleep until the old window freed up, and
		// on a loaded machine the burst sometimes missed every window.)
		srv.Do(t, "DEL", base+"log:1")
		srv.Do(t, "HSET", base+"meta", "sum", 0, "back", 0)
		l := []rate.Limit{{N: 8 + i%2, Per: 300 * time.Millisecond}}
		rates[0] = append(rates[0], change(t, q, l)...)
	}
	r.waitAll(20 * time.Second)
	violations, starts := windowViolations(t, r.events(), rates)
	t.Logf("reset on change: %d starts, %d windows over the rate in force", starts, len(violations[0]))
	assert.NotEmpty(t, violations[0], "the checker missed the bursts after the resets")
}

// TestRateCheckerCatchesIgnoredUnits: clients that take one unit per start
// but use the 3 or 4 they meant to (a gate that counts starts, not units).
func TestRateCheckerCatchesIgnoredUnits(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	initial := []rate.Limit{{N: 6, Per: 200 * time.Millisecond}}
	r := newRateRun(t, srv, initial, "-units", "3,4", "-goroutines", "2", "-dur", "2s", "-mode", "mut-oneunit")
	for i := 0; i < 2; i++ {
		r.spawn()
	}
	r.waitAll(20 * time.Second)
	violations, starts := windowViolations(t, r.events(), [][]redistest.Rate{{{N: 6, Per: 200 * time.Millisecond}}})
	t.Logf("units ignored: %d starts, %d windows over the rate", starts, len(violations[0]))
	assert.NotEmpty(t, violations[0], "the checker missed starts that took fewer units than they used")
}
