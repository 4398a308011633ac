package history

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// hold returns the acq, relstart and rel events of one hold of holder
// (pid, g): tokens toks from start to end (µs), with fence f.
func hold(pid, g, s int, f int64, start, end int64, toks ...string) []Event {
	acq := Event{K: KAcq, W: pid, Pid: pid, G: g, S: s, N: len(toks), Tok: toks[0], Fence: f,
		T0: start - 1, T: start, DL: 1 << 40, Valid: true}
	if len(toks) > 1 {
		acq.Toks = toks
	}
	return []Event{
		acq,
		{K: KRelStart, W: pid, Pid: pid, G: g, S: s, Tok: toks[0], Fence: f, T: end, Valid: true},
		{K: KRel, W: pid, Pid: pid, G: g, S: s, Tok: toks[0], Fence: f, Class: "ok"},
	}
}

func join(hs ...[]Event) []Event {
	var out []Event
	for _, h := range hs {
		out = append(out, h...)
	}
	return out
}

// Holders are (pid, goroutine): two goroutines of one process number their
// acquisitions independently.
func TestCheckGoroutinesOfOneProcess(t *testing.T) {
	evs := join(
		hold(7, 0, 1, 100, 10, 20, "e:1"),
		hold(7, 1, 1, 101, 11, 21, "e:2"),
		hold(7, 1, 2, 102, 30, 40, "e:1"),
	)
	r := Check(evs, Options{N: 2})
	assert.True(t, r.OK(), "%v", r.Violations)
	assert.Equal(t, 1, r.Workers)
	assert.Equal(t, 2, r.Holders)
	assert.Equal(t, 3, r.Holds)
	assert.Equal(t, 2, r.MaxOverlap)
}

// A hold of k tokens counts k permits.
func TestCheckWeightedPermits(t *testing.T) {
	ok := join(
		hold(1, 0, 1, 100, 10, 100, "e:1", "e:2", "e:3"),
		hold(2, 0, 1, 101, 20, 50, "e:4"),
		hold(2, 0, 2, 102, 60, 90, "e:4"),
	)
	r := Check(ok, Options{N: 4})
	assert.True(t, r.OK(), "%v", r.Violations)
	assert.Equal(t, 4, r.MaxOverlap)
	assert.Equal(t, 2, r.MaxHolds)
	assert.Equal(t, 5, r.Permits)
	assert.Equal(t, 1, r.Weighted)

	over := append(ok, hold(3, 0, 1, 103, 30, 40, "e:5", "e:6")...)
	r = Check(over, Options{N: 4})
	assert.Equal(t, 1, r.Kinds["overlap"], "%v", r.Violations)
	assert.Equal(t, 6, r.MaxOverlap)
}

// No token twice: not in two holds at once, not twice in one hold.
func TestCheckWeightedTokens(t *testing.T) {
	r := Check(join(
		hold(1, 0, 1, 100, 10, 100, "e:1", "e:2"),
		hold(1, 1, 1, 101, 50, 60, "e:2"),
	), Options{N: 4})
	assert.Equal(t, 1, r.Kinds["token"], "%v", r.Violations)

	r = Check(hold(1, 0, 1, 100, 10, 100, "e:1", "e:1"), Options{N: 4})
	assert.Equal(t, 1, r.Kinds["token"], "%v", r.Violations)

	// one after the other is fine
	r = Check(join(
		hold(1, 0, 1, 100, 10, 50, "e:1", "e:2"),
		hold(1, 1, 1, 101, 50, 60, "e:2", "e:3"),
	), Options{N: 4})
	assert.True(t, r.OK(), "%v", r.Violations)
}

// The k tokens of one acquisition share its fence; two acquisitions never
// do, and a later acquisition has the larger one.
func TestCheckWeightedFences(t *testing.T) {
	r := Check(join(
		hold(1, 0, 1, 100, 10, 20, "e:1", "e:2", "e:3"),
		hold(2, 0, 1, 100, 30, 40, "e:1"),
	), Options{N: 4})
	assert.Positive(t, r.Kinds["fence"], "%v", r.Violations)

	r = Check(join(
		hold(1, 0, 1, 200, 10, 20, "e:1", "e:2"),
		hold(2, 0, 1, 150, 30, 40, "e:1", "e:2"),
	), Options{N: 4})
	assert.Equal(t, 1, r.Kinds["fence"], "%v", r.Violations)
}

// A lease on fewer or more tokens than asked for is a violation.
func TestCheckWeightedCount(t *testing.T) {
	evs := hold(1, 0, 1, 100, 10, 20, "e:1", "e:2")
	evs[0].N = 3
	r := Check(evs, Options{N: 4})
	assert.Equal(t, 1, r.Kinds["permits"], "%v", r.Violations)
}

// A read-write lock: readers share, a writer overlaps nobody. The checker
// catches a writer that overlaps a reader or another writer.
func TestCheckRW(t *testing.T) {
	ok := join(
		hold(1, 0, 1, 100, 10, 50, "e:r"),
		hold(2, 0, 1, 101, 20, 60, "e:r"),
		hold(3, 0, 1, 102, 60, 80, "e:w"),
		hold(1, 0, 2, 103, 80, 90, "e:r"),
	)
	r := Check(ok, Options{N: 1, RW: true})
	assert.True(t, r.OK(), "%v", r.Violations)
	assert.Equal(t, 1, r.Writes)
	assert.Equal(t, 2, r.MaxReaders)

	// The writer starts while a reader still holds.
	r = Check(append(ok, hold(4, 0, 1, 104, 40, 45, "e:w")...), Options{N: 1, RW: true})
	assert.Equal(t, 2, r.Kinds["rw"], "%v", r.Violations)

	// Two writers at once are one violation.
	r = Check(append(ok, hold(4, 0, 1, 104, 70, 75, "e:w")...), Options{N: 1, RW: true})
	assert.Equal(t, 1, r.Kinds["rw"], "%v", r.Violations)

	// Without RW the shared read token is two holders of one token.
	r = Check(ok, Options{N: 1})
	assert.Positive(t, r.Kinds["token"])
}
