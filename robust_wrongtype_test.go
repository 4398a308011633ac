package redsem

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// Every operation that runs a script, against every key of the layout it
// may touch overwritten by a stranger with every other type: the operation
// either fails with ErrWrongType and writes nothing, or does its job without
// touching that key. Once the key is restored nothing is lost: the
// inventory is whole and the holder's lease intact (issue 11, bug 5).

// wrongTypeState is what one case runs in: a semaphore in a given state, the keys of its layout with their types, and the operation.
type wrongTypeState struct {
	s      *Semaphore
	keys   map[string]layoutKey // role ("meta", "pend"...) -> key
	holder *Lease               // a lease no failed operation may touch
	// strangers is how many strangers the state put on the token list: a
	// refused operation leaves them there, so Check may report them.
	strangers int
	run       func(ctx context.Context) error
}

// layoutKey is a key of the layout and the type it holds.
type layoutKey struct{ name, typ string }

// wrongTypeOp prepares the state of one operation on a fresh database.
type wrongTypeOp struct {
	name    string
	prepare func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState
	deletes bool // a success removes every key (Delete)
	// moved: it runs behind a waiter's BLMOVE, which a failure undoes (the
	// token back at the token list's head), unless the move's own keys are
	// the strangers.
	moved bool
}

// farFuture is a waits score (ms) no test reaches.
const farFuture = 4102444800000

// semState is a semaphore of size 6 with, besides free tokens 5 and 6:
// holder (slot 1), an expired lease not reclaimed yet (slot 2), a waiter
// whose BLMOVE moved slot 3 into its pending list, and lease r (slot 4).
// With sweep, meta's due has passed, so acquisitions sweep first.
func semState(t *testing.T, b *backend, ctx context.Context, sweep bool) (st *wrongTypeState, waiter string, r *Lease) {
	return semStateAt(t, b, ctx, sweep, farFuture)
}

// semStateAt is semState with the waiter's waits score at waitsMs (1: it
// died, its pending list is stale).
func semStateAt(t *testing.T, b *backend, ctx context.Context, sweep bool, waitsMs int64) (st *wrongTypeState, waiter string, r *Lease) {
	s := newSem(t, b, "wt", 6, WithTTL(time.Minute), WithFixedTTL())
	held := holdN(t, ctx, s.TryAcquire, 2)
	b.do(t, "ZADD", s.k.leases, "XX", 1, held[1].Token())
	waiter = engine.NewAcqID()
	b.do(t, "LMOVE", s.k.tokens, s.k.pend(waiter), "LEFT", "RIGHT")
	b.do(t, "ZADD", s.k.waits, waitsMs, "w:"+waiter)
	r, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	if sweep {
		b.do(t, "HSET", s.k.meta, "due", 1)
	}
	return &wrongTypeState{s: s, holder: held[0], keys: semKeys(s, waiter)}, waiter, r
}

// collectorState is a semaphore of size 3: holder (slot 1), lease x (slot
// 2), and a weighted acquisition of 2 collecting, with slot 3 so far.
func collectorState(t *testing.T, b *backend, ctx context.Context) (st *wrongTypeState, coll string, x *Lease) {
	s := newSem(t, b, "wt", 3, WithTTL(time.Minute), WithFixedTTL())
	held := holdN(t, ctx, s.TryAcquire, 2)
	coll = engine.NewAcqID()
	r, err := parseAcquireNReply(engine.RunScript(ctx, b.pool.Get(), s.acquireNCall(coll, 2, 5000, "fresh")))
	require.NoError(t, err)
	require.Equal(t, int64(modeCollect), r.Mode, "%+v", r)
	return &wrongTypeState{s: s, holder: held[0], keys: semKeys(s, coll)}, coll, held[1]
}

// semKeys are the keys of s's layout that acquisition acq may touch.
func semKeys(s *Semaphore, acq string) map[string]layoutKey {
	return map[string]layoutKey{
		"meta": {s.k.meta, "hash"}, "tokens": {s.k.tokens, "list"}, "leases": {s.k.leases, "zset"},
		"holders": {s.k.holders, "hash"}, "waits": {s.k.waits, "zset"}, "pend": {s.k.pend(acq), "list"},
		"bell": {s.k.bell(acq), "list"}, "wqueue": {s.k.wqueue(), "list"},
	}
}

func (op wrongTypeOp) behindMove() wrongTypeOp { op.moved = true; return op }

func semOp(name string, sweep bool, run func(st *wrongTypeState, waiter string, r *Lease) func(context.Context) error) wrongTypeOp {
	return wrongTypeOp{name: name, prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
		st, waiter, r := semState(t, b, ctx, sweep)
		st.run = run(st, waiter, r)
		return st
	}}
}

func wrongTypeOps() []wrongTypeOp {
	acquire := func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
		return func(ctx context.Context) error { _, err := st.s.Acquire(ctx); return err }
	}
	tryAcquire := func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
		return func(ctx context.Context) error { _, err := st.s.TryAcquire(ctx); return err }
	}
	acquireN := func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
		return func(ctx context.Context) error { _, err := st.s.AcquireN(ctx, 2); return err }
	}
	ops := []wrongTypeOp{
		semOp("Acquire", false, acquire),
		semOp("Acquire/sweep", true, acquire),
		semOp("TryAcquire", false, tryAcquire),
		semOp("TryAcquire/sweep", true, tryAcquire),
		semOp("AcquireN", false, acquireN),
		semOp("AcquireN/sweep", true, acquireN),
		semOp("TryAcquireN", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.TryAcquireN(ctx, 2); return err }
		}),
		// The blocked waiter's lease script, behind its served BLMOVE.
		semOp("Acquire/blocked", false, func(st *wrongTypeState, w string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error {
				c := st.s.pool.(testPool).Get()
				defer c.Close()
				_, err := parseAcquireReply(engine.RunScript(ctx, c, st.s.acquireCall(w, time.Second, "wait")))
				return mapErr(err, st.s.scriptError, "acquire")
			}
		}).behindMove(),
		semOp("Acquire/blocked/sweep", true, func(st *wrongTypeState, w string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error {
				c := st.s.pool.(testPool).Get()
				defer c.Close()
				_, err := parseAcquireReply(engine.RunScript(ctx, c, st.s.acquireCall(w, time.Second, "wait")))
				return mapErr(err, st.s.scriptError, "acquire")
			}
		}).behindMove(),
		// A cancelled wait settles (abort.lua), in both of its modes.
		semOp("Acquire/cancelled", false, func(st *wrongTypeState, w string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := st.s.abort(ctx, w, "release")
				return mapErr(err, st.s.scriptError, "abort")
			}
		}),
		semOp("Acquire/resolve", false, func(st *wrongTypeState, _ string, r *Lease) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := st.s.abort(ctx, r.acqID, "release")
				return mapErr(err, st.s.scriptError, "abort")
			}
		}),
		semOp("Release", false, func(_ *wrongTypeState, _ string, r *Lease) func(context.Context) error {
			return r.Release
		}),
		semOp("Refresh", false, func(_ *wrongTypeState, _ string, r *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return r.Refresh(ctx, 2*time.Minute) }
		}),
		semOp("Refresh/shorter", false, func(_ *wrongTypeState, _ string, r *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return r.Refresh(ctx, time.Second) }
		}),
		semOp("Reclaim", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Reclaim(ctx); return err }
		}),
		{name: "Reclaim/stale-waiter", prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st, _, _ := semStateAt(t, b, ctx, true, 1)
			st.run = func(ctx context.Context) error { _, err := st.s.Reclaim(ctx); return err }
			return st
		}},
		semOp("Resize/up", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return st.s.Resize(ctx, 8) }
		}),
		semOp("Resize/down", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { return st.s.Resize(ctx, 3) }
		}),
		semOp("Repair", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Repair(ctx); return err }
		}),
		semOp("Check", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Check(ctx); return err }
		}),
		semOp("Status", false, func(st *wrongTypeState, _ string, _ *Lease) func(context.Context) error {
			return func(ctx context.Context) error { _, err := st.s.Status(ctx); return err }
		}),
		{name: "Delete", deletes: true, prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st, _, _ := semState(t, b, ctx, false)
			st.run = st.s.Delete
			return st
		}},
		{name: "AcquireN/collecting", prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st, coll, _ := collectorState(t, b, ctx)
			st.run = func(ctx context.Context) error {
				c := st.s.pool.(testPool).Get()
				defer c.Close()
				_, err := parseAcquireNReply(engine.RunScript(ctx, c, st.s.acquireNCall(coll, 2, 5000, "wait")))
				return mapErr(err, st.s.scriptError, "acquire")
			}
			return st
		}},
		{name: "AcquireN/cancelled", prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st, coll, _ := collectorState(t, b, ctx)
			st.run = func(ctx context.Context) error {
				_, err := st.s.abortN(ctx, coll, 2, "release")
				return mapErr(err, st.s.scriptError, "abort")
			}
			return st
		}},
		// A release whose token goes to the collector, ringing its bell.
		{name: "Release/to-collector", prepare: func(t *testing.T, b *backend, ctx context.Context) *wrongTypeState {
			st, _, x := collectorState(t, b, ctx)
			st.run = x.Release
			return st
		}},
	}
	return append(ops, moreWrongTypeOps()...)
}

func TestSemaphore_WrongType_writesNothing(t *testing.T) {
	t.Parallel()
	// Each operation on servers of its own, so that the operations run in
	// parallel: one after the other they took two minutes.
	for _, op := range wrongTypeOps() {
		t.Run(op.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b *backend) {
				// Untouched, the state is sound and the operation works.
				ctx := ctxT(t, 2*time.Minute)
				require.NoError(t, op.prepare(t, b, ctx).run(ctx), op.name)
				types := []string{"string", "list", "hash", "set", "zset"}
				if b.mini != nil && realRedisRuns() {
					// Real Redis runs the whole matrix, and its WRONGTYPE
					// answers are the ones that count; miniredis, whose Lua
					// made this test the suite's costliest, checks two
					// types, so every key is still tried under a wrong one.
					types = []string{"string", "hash"}
				}
				for _, typ := range types {
					t.Run(typ, func(t *testing.T) {
						b.do(t, "FLUSHALL")
						ctx := ctxT(t, 2*time.Minute)
						roles := op.prepare(t, b, ctx).keys
						for role, k := range roles {
							if k.typ == typ {
								continue
							}
							b.do(t, "FLUSHALL")
							st := op.prepare(t, b, ctx)
							checkWrongType(t, b, op, st, st.keys[role].name, typ)
						}
					})
				}
			})
		})
	}
}

func checkWrongType(t *testing.T, b *backend, op wrongTypeOp, st *wrongTypeState, key, typ string) {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	orig := b.snapshot(t)[key]
	holderScore := b.do(t, "ZSCORE", st.s.k.leases, st.holder.Token())
	redistest.WriteStranger(t, b.addr, key, typ)
	before := b.snapshot(t)

	// No operation here waits out its context: each fails or succeeds
	// at once, and this bound only ends one that hangs.
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := st.run(octx)
	cancel()
	after := b.snapshot(t)
	what := fmt.Sprintf("%s with %s a %s", op.name, key, typ)
	if errors.Is(err, ErrRepairUnsafe) {
		// Repair did its job and found a slot it may not mint: the token
		// the stranger overwrote.
		err = nil
	}
	if err != nil {
		if !assert.ErrorIs(t, err, ErrWrongType, what) {
			return
		}
		if pend, tokens := st.keys["pend"].name, st.keys["tokens"].name; op.moved && key != pend && key != tokens {
			// No token may stay in a pending list whose registration a
			// stranger's key may have taken: the move was undone.
			assert.NotContains(t, after, pend, "%s: the token stayed pending", what)
			b.do(t, "LMOVE", tokens, pend, "LEFT", "RIGHT")
			after = b.snapshot(t)
		}
		assert.Equal(t, before, after, "%s: failed, but wrote", what)
	} else if op.deletes {
		assert.Empty(t, after, "%s: Delete left keys", what)
		return
	} else {
		assert.Equal(t, before[key], after[key], "%s: succeeded and wrote the stranger's key", what)
	}

	// The key restored, nothing is lost.
	b.write(t, key, orig)
	inv, cerr := st.s.Check(ctx)
	require.NoError(t, cerr, what)
	if len(inv.Strangers) <= st.strangers {
		inv.Strangers = nil // the state's own, left by a refused operation
	}
	assert.True(t, inv.Healthy(), "%s: after restoring: %+v", what, inv)
	if err != nil {
		assert.Equal(t, holderScore, b.do(t, "ZSCORE", st.s.k.leases, st.holder.Token()), "%s: the holder's lease", what)
		rec, rerr := redis.String(b.do(t, "HGET", st.s.k.holders, "t:"+st.holder.Token()), nil)
		require.NoError(t, rerr, "%s: the holder's record is gone", what)
		assert.Equal(t, st.holder.acqID, owner(rec), what)
	}
}

func owner(rec string) string {
	for i := 0; i < len(rec); i++ {
		if rec[i] == '|' {
			return rec[:i]
		}
	}
	return rec
}

// mapErr maps a script's error as the public operation would.
func mapErr(err error, mapping func(string, error) error, op string) error {
	if err == nil {
		return nil
	}
	return mapping(op, err)
}

// Bad input: a semaphore key overwritten with another type surfaces as
// ErrWrongType from every operation, with nothing written or lost.
func TestSemaphore_WrongType_keys(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "typed", 2)
		held, err := s.Acquire(ctx)
		require.NoError(t, err)
		for _, key := range []string{s.k.tokens, s.k.leases, s.k.holders, s.k.meta, s.k.waits} {
			existed, err := redis.Bool(b.do(t, "EXISTS", key), nil)
			require.NoError(t, err)
			if existed {
				b.do(t, "RENAME", key, "saved")
			}
			b.do(t, "SET", key, "not yours")
			l, err := s.TryAcquire(ctx)
			if key == s.k.waits {
				// The fast path does not use waits until a sweep is due;
				// hold the free token so that Acquire has to wait.
				require.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrWrongType, key)
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = s.Acquire(wctx)
			cancel()
			assert.ErrorIs(t, err, ErrWrongType, key)
			if l != nil {
				require.NoError(t, l.Release(ctx))
			}
			_, err = s.Status(ctx)
			assert.ErrorIs(t, err, ErrWrongType, key)
			_, err = s.Reclaim(ctx)
			assert.ErrorIs(t, err, ErrWrongType, key)
			if key == s.k.leases || key == s.k.holders {
				assert.ErrorIs(t, held.Refresh(ctx, time.Minute), ErrWrongType, key)
			}
			if key != s.k.waits && key != s.k.meta {
				assert.ErrorIs(t, held.Release(ctx), ErrWrongType, key)
			}
			v, err := redis.String(b.do(t, "GET", key), nil)
			require.NoError(t, err)
			assert.Equal(t, "not yours", v, "the foreign value is untouched")
			b.do(t, "DEL", key)
			if existed {
				b.do(t, "RENAME", "saved", key)
			}
		}
		require.NoError(t, held.Release(ctx))
		requireInventory(t, s, 2, 0)
	})
}

// A token moved to a blocked waiter while a stranger's string sat on waits,
// where the waiter's registration was, goes back to the token list as the
// waiter's script fails: once the operator deletes the bad key the
// semaphore is whole, and no pending list is left for a sweep to miss.
func TestSemaphore_WrongType_waitsOverABlockedWaiter(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, k := range []int{0, 2} { // Acquire, AcquireN(2)
			b.do(t, "FLUSHALL")
			ctx := ctxT(t, 20*time.Second)
			s := newSem(t, b, "strand", 2, WithTTL(time.Minute), WithWaitConnections(0))
			held := holdN(t, ctx, s.Acquire, 2)
			got := make(chan error, 1)
			go func() {
				var werr error
				if k == 0 {
					_, werr = s.Acquire(ctx)
				} else {
					_, werr = s.AcquireN(ctx, k)
				}
				got <- werr
			}()
			require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 10*time.Second, 5*time.Millisecond)
			b.do(t, "SET", s.k.waits, "a stranger's")
			require.NoError(t, held[0].Release(ctx))
			require.ErrorIs(t, <-got, ErrWrongType, "k %d", k)
			require.NoError(t, held[1].Release(ctx))

			b.do(t, "DEL", s.k.waits)
			keys, err := redis.Strings(b.do(t, "KEYS", "*:pend:*"), nil)
			require.NoError(t, err)
			assert.Empty(t, keys, "k %d: a pending list is left", k)
			requireInventory(t, s, 2, 0)
			l, err := s.TryAcquire(ctx)
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
		}
	})
}
