package faults

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// A checker that cannot fail proves nothing: each broken client below runs
// against a real server next to correct library clients, and the history
// checker (plus the token count after quiescence) must catch it.

// TestCheckerCatchesReleaseWithoutOwnershipCheck: holders that stall past
// their TTL and then free "their" token with a raw ZREM+HDEL+LPUSH, without
// checking they still own it, delete the lease of the token's next holder and
// hand the token to a third client while the second still holds it.
func TestCheckerCatchesReleaseWithoutOwnershipCheck(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRun(t, srv, 2, 300*time.Millisecond, 200*time.Millisecond)
	for i := 0; i < 4; i++ {
		r.spawn("-mode", "mut-norelcheck", "-dur", "4s", "-holdmin", "40ms", "-holdmax", "120ms", "-gapmax", "5ms", "-stalep", "0.3")
	}
	r.waitAll(30 * time.Second)
	rep := history.Check(r.events(), history.Options{N: 2})
	t.Logf("broken release: %s", rep.Summary())
	assert.Positive(t, rep.Kinds["token"], "the checker missed two holders of one token")
	assert.False(t, rep.OK())
}

// TestCheckerCatchesReclaimerIgnoringLeases: a rogue reclaimer gives back the
// tokens of live leases; library clients then get tokens that are still held.
func TestCheckerCatchesReclaimerIgnoringLeases(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRun(t, srv, 2, time.Second, 200*time.Millisecond)
	for i := 0; i < 4; i++ {
		r.spawn("-dur", "3s", "-holdmin", "20ms", "-holdmax", "80ms")
	}
	r.spawn("-mode", "mut-reclaim", "-dur", "3s", "-holdmin", "5ms", "-holdmax", "30ms")
	r.waitAll(30 * time.Second)
	rep := history.Check(r.events(), history.Options{N: 2})
	t.Logf("broken reclaimer: %s", rep.Summary())
	assert.Positive(t, rep.Kinds["token"], "the checker missed two holders of one token")
	assert.Positive(t, rep.Kinds["overlap"], "the checker missed more than N holders")
}

// TestCheckerCatchesPopWithoutLease: clients that take tokens with a raw
// BLPOP and record no lease are flagged as unleased holds, and once such a
// client is killed while holding, its token is gone for good: the quiescence
// check counts it lost.
func TestCheckerCatchesPopWithoutLease(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRun(t, srv, 2, 500*time.Millisecond, 200*time.Millisecond)
	for i := 0; i < 3; i++ {
		r.spawn("-dur", "3s", "-holdmin", "10ms", "-holdmax", "40ms", "-acqtimeout", "2s")
	}
	var raw []*proc
	for i := 0; i < 2; i++ {
		raw = append(raw, r.spawn("-mode", "mut-rawpop", "-dur", "10s", "-holdmin", "100ms", "-holdmax", "200ms", "-gapmax", "2ms"))
	}
	// Kill each raw client while it holds a token (its history shows an acq
	// without a relstart).
	killed := 0
	for _, p := range raw {
		ok := waitFor(8*time.Second, func() bool {
			evs, _, err := history.Read(r.hist)
			if err != nil {
				return false
			}
			open := false
			for _, e := range evs {
				if e.Pid == p.pid() && e.K == history.KAcq {
					open = true
				}
				if e.Pid == p.pid() && e.K == history.KRelStart {
					open = false
				}
			}
			return open
		})
		require.True(t, ok, "raw client never held a token")
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		p.kill9()
		killed++
	}
	r.waitAll(30 * time.Second)
	rep := history.Check(r.events(), history.Options{N: 2})
	_, lost, took := settle(t, r.ops(), r.sem(), 3*time.Second)
	t.Logf("raw pop: %s; raw clients killed=%d tokens lost=%d (after %v)", rep.Summary(), killed, lost, took.Round(time.Millisecond))
	assert.Positive(t, rep.Kinds["unleased"], "the checker missed holds without a lease")
	assert.Positive(t, lost, "the quiescence check missed the tokens the killed raw clients took")
}

// TestCheckerCatchesWeightedEarlyFree: weighted holders that free one of
// their k tokens behind the library's back (its lease and record removed and
// the token pushed back, raw) halfway through the hold, and go on as if they
// held all k. A library client then holds that token too: the checker must
// see the token held twice and more permits held than the size.
func TestCheckerCatchesWeightedEarlyFree(t *testing.T) {
	t.Parallel()
	const n = 4
	srv := redistest.Start(t)
	r := newRun(t, srv, n, time.Second, 200*time.Millisecond)
	for i := 0; i < 2; i++ {
		r.spawn("-mode", "mut-wleak", "-weighted", "2,3", "-goroutines", "2", "-leakafter", "0.3",
			"-dur", "3s", "-holdmin", "60ms", "-holdmax", "150ms", "-gapmax", "5ms")
	}
	for i := 0; i < 2; i++ {
		r.spawn("-weighted", "1", "-goroutines", "2", "-dur", "3s", "-holdmin", "20ms", "-holdmax", "60ms", "-gapmax", "5ms")
	}
	r.waitAll(30 * time.Second)
	rep := history.Check(r.events(), history.Options{N: n})
	t.Logf("broken weighted holder: %s", rep.Summary())
	assert.Positive(t, rep.Weighted, "no weighted holds")
	assert.Positive(t, rep.Kinds["token"], "the checker missed a token held twice")
	assert.Positive(t, rep.Kinds["overlap"], "the checker missed more permits held than the size")
	assert.Greater(t, rep.MaxOverlap, n)
}
