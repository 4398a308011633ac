package redsem

import (
	"context"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/require"
)

// Two more states for TestSemaphore_WrongType_writesNothing: strangers on the token
// list (which the acquire fast path pops, drops and counts as rejected
// before it meets a key of the wrong type, and must put back), and a shrink
// still draining (meta over, held and the withheld tokens h:1, h:2 set).

// strangerState is semState with strangers at the head of the token list: a
// forged token and one of an older epoch. With noneFree, the free tokens 5
// and 6 are leased too, so a fresh acquisition pops the strangers, finds
// nothing and registers as a waiter (in waits: the key whose wrong type it
// meets last, after dropping the strangers). With noRejected, meta has no
// rejected field: the scripts create it when they first count a stranger,
// and nothing requires it before, so a refused call must not leave one.
func strangerState(t *testing.T, b *backend, ctx context.Context, noneFree, noRejected bool) *wrongTypeState {
	st, _, _ := semState(t, b, ctx, false)
	if noneFree {
		holdN(t, ctx, st.s.TryAcquire, 2)
	}
	b.do(t, "LPUSH", st.s.k.tokens, "0123456789ab:2", "forged")
	if noRejected {
		b.do(t, "HDEL", st.s.k.meta, "rejected")
	} else {
		b.do(t, "HSET", st.s.k.meta, "rejected", 3)
	}
	st.strangers = 2
	return st
}

// acquireScriptOp runs acquire.lua fresh for a new acquisition, as the first
// call of Acquire (blockMs > 0) or TryAcquire (0) does: with nothing free it
// answers "block" rather than an error.
func acquireScriptOp(st *wrongTypeState, blockMs int64) func(context.Context) error {
	return func(ctx context.Context) error {
		c := st.s.pool.(testPool).Get()
		defer c.Close()
		_, err := parseAcquireReply(engine.RunScript(ctx, c, st.s.acquireCall(engine.NewAcqID(), time.Duration(blockMs)*time.Millisecond, "fresh")))
		return mapErr(err, st.s.scriptError, "acquire")
	}
}

// shrinkState is a semaphore of size 7 shrunk to 5 while leases on the
// retired tokens 6 and 7 are out: meta over is 2, two of the free valid
// tokens 2, 3, 4 are withheld (meta held, h:1 and h:2) and one is on the
// list; holder has slot 1, lease r slot 5, and retired is the lease on 6.
func shrinkState(t *testing.T, b *backend, ctx context.Context) (st *wrongTypeState, r, retired *Lease) {
	s := newSem(t, b, "wt", 7, WithTTL(time.Minute), WithFixedTTL())
	ls := holdN(t, ctx, s.TryAcquire, 7)
	for _, l := range ls[1:4] {
		require.NoError(t, l.Release(ctx))
	}
	require.NoError(t, s.Resize(ctx, 5))
	m, err := redis.StringMap(b.do(t, "HGETALL", s.k.meta), nil)
	require.NoError(t, err)
	require.Equal(t, "2", m["over"], "the shrink drains: %v", m)
	require.Equal(t, "2", m["held"], "two tokens withheld: %v", m)
	require.Equal(t, int64(1), b.do(t, "LLEN", s.k.tokens), "one free token on the list")
	s = newSem(t, b, "wt", 5, WithTTL(time.Minute), WithFixedTTL())
	return &wrongTypeState{s: s, holder: ls[0], keys: semKeys(s, engine.NewAcqID())}, ls[4], ls[5]
}

func moreWrongTypeOps() []wrongTypeOp {
	stranger := func(name string, noneFree, noRejected bool, run func(st *wrongTypeState) func(context.Context) error) wrongTypeOp {
		return wrongTypeOp{name: name, prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st := strangerState(t, b, ctx, noneFree, noRejected)
			st.run = run(st)
			return st
		}}
	}
	shrink := func(name string, run func(st *wrongTypeState, r, retired *Lease) func(context.Context) error) wrongTypeOp {
		return wrongTypeOp{name: name, prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st, r, retired := shrinkState(t, b, ctx)
			st.run = run(st, r, retired)
			return st
		}}
	}
	acquire := func(st *wrongTypeState) func(context.Context) error {
		return func(ctx context.Context) error { _, err := st.s.Acquire(ctx); return err }
	}
	tryAcquire := func(st *wrongTypeState) func(context.Context) error {
		return func(ctx context.Context) error { _, err := st.s.TryAcquire(ctx); return err }
	}
	acquireN := func(st *wrongTypeState) func(context.Context) error {
		return func(ctx context.Context) error { _, err := st.s.AcquireN(ctx, 2); return err }
	}
	waitFresh := func(st *wrongTypeState) func(context.Context) error { return acquireScriptOp(st, 1000) }
	tryFresh := func(st *wrongTypeState) func(context.Context) error { return acquireScriptOp(st, 0) }
	return []wrongTypeOp{
		stranger("Acquire/strangers", false, false, acquire),
		stranger("TryAcquire/strangers", false, false, tryAcquire),
		stranger("AcquireN/strangers", false, false, acquireN),
		stranger("Acquire/strangers/none-free", true, false, waitFresh),
		stranger("Acquire/strangers/none-free/no-rejected", true, true, waitFresh),
		stranger("TryAcquire/strangers/none-free/no-rejected", true, true, tryFresh),
		stranger("Repair/strangers", false, false, func(st *wrongTypeState) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Repair(ctx); return err }
		}),
		shrink("Acquire/shrinking", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error { return acquire(st) }),
		shrink("TryAcquire/shrinking", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error { return tryAcquire(st) }),
		shrink("Acquire/shrinking/none-free", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error {
				if _, err := st.s.TryAcquire(ctx); err != nil {
					return err
				}
				return acquireScriptOp(st, 1000)(ctx)
			}
		}),
		shrink("TryAcquireN/shrinking", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.TryAcquireN(ctx, 1); return err }
		}),
		shrink("Release/shrinking", func(_ *wrongTypeState, r, _ *Lease) func(context.Context) error { return r.Release }),
		shrink("Release/shrinking/retired", func(_ *wrongTypeState, _, retired *Lease) func(context.Context) error {
			return retired.Release
		}),
		shrink("Refresh/shrinking/retired", func(_ *wrongTypeState, _, retired *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return retired.Refresh(ctx, 2*time.Minute) }
		}),
		shrink("Reclaim/shrinking", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Reclaim(ctx); return err }
		}),
		shrink("Resize/shrinking/up", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return st.s.Resize(ctx, 7) }
		}),
		shrink("Resize/shrinking/down", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return st.s.Resize(ctx, 3) }
		}),
		shrink("Repair/shrinking", func(st *wrongTypeState, _, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Repair(ctx); return err }
		}),
	}
}
