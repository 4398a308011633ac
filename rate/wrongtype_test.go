package rate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// Every script a gate runs, against every key of its layout overwritten by a
// stranger with every other type: the operation either fails with
// ErrWrongType and writes nothing, or does its job without touching that
// key; once the key is restored the gate works again.

// gateOp is one operation on a gate of 2 per minute with one start taken;
// acq is an acquisition of its own that the operation may use.
type gateOp struct {
	name string
	// prepare readies the operation on a fresh gate (the stranger comes
	// after) and returns it.
	prepare func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error
}

func gateOps() []gateOp {
	return []gateOp{
		{"Allow", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			return func(ctx context.Context) error { _, err := g.Allow(ctx); return err }
		}},
		{"Wait", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			return func(ctx context.Context) error { _, err := g.Wait(ctx); return err }
		}},
		// A queued waiter's script, woken in its BLPOP: the gate is full, so
		// it is still queued (and keeps time).
		{"Wait/blocked", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			_, err := g.Allow(ctx)
			require.NoError(t, err)
			r, err := parseRateReply(engine.RateTake.Do(b.pool.Get(), g.q.takeCall(acq, 5e6, "fresh", []int{1}).KeysAndArgs...))
			require.NoError(t, err)
			require.Equal(t, int64(0), r.Code, "the gate is full: queued")
			return func(ctx context.Context) error {
				c := b.pool.Get()
				defer c.Close()
				_, err := parseRateReply(engine.RateTake.Do(c, g.q.takeCall(acq, 5e6, "wait", []int{1}).KeysAndArgs...))
				if err != nil {
					return g.q.scriptError("wait", err)
				}
				return nil
			}
		}},
		{"cancelled", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				_, err := (&takeUnits{q: g.q, units: []int{1}}).Abort(ctx, acq, "release")
				if err != nil {
					return g.q.scriptError("abort", err)
				}
				return nil
			}
		}},
		{"AllowN", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			return func(ctx context.Context) error { _, err := g.AllowN(ctx, 1); return err }
		}},
		{"SetRate", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			return func(ctx context.Context) error { return g.SetRate(ctx, 2, time.Minute) }
		}},
		{"Status", func(t *testing.T, b *backend, ctx context.Context, g *Gate, acq string) func(ctx context.Context) error {
			return func(ctx context.Context) error { _, err := g.Status(ctx); return err }
		}},
	}
}

func TestWrongTypeWritesNothing(t *testing.T) {
	t.Parallel()
	types := []string{"hash", "hash", "list", "zset", "zset", "zset", "zset", "zset", "list"}
	roles := []string{"meta", "holders", "queue", "waits", "log1", "log2", "log3", "log4", "inbox"}
	eachBackend(t, func(t *testing.T, b *backend) {
		for _, op := range gateOps() {
			for i, role := range roles {
				for _, typ := range []string{"string", "list", "hash", "set", "zset"} {
					if typ == types[i] {
						continue
					}
					what := fmt.Sprintf("%s with %s a %s", op.name, role, typ)
					b.do(t, "FLUSHALL")
					ctx := ctxT(t, 20*time.Second)
					g := newGate(t, b, "wt", 2, time.Minute)
					_, err := g.Allow(ctx)
					require.NoError(t, err)
					acq := engine.NewAcqID()
					run := op.prepare(t, b, ctx, g, acq)
					key := g.q.k.args(acq)[i].(string)
					orig := redistest.Snapshot(t, b.addr)[key]
					redistest.WriteStranger(t, b.addr, key, typ)
					before := redistest.Snapshot(t, b.addr)

					octx, cancel := context.WithTimeout(ctx, 2*time.Second)
					err = run(octx)
					cancel()
					after := redistest.Snapshot(t, b.addr)
					if err != nil {
						if !assert.ErrorIs(t, err, ErrWrongType, what) {
							continue
						}
						assert.Equal(t, before, after, "%s: failed, but wrote", what)
					} else {
						assert.Equal(t, before[key], after[key], "%s: succeeded and wrote the stranger's key", what)
					}

					// The key restored, the gate works.
					redistest.Write(t, b.addr, key, orig)
					if _, err := g.Allow(ctx); err != nil {
						assert.ErrorIs(t, err, ErrRateLimited, "%s: after restoring", what)
					}
				}
			}
		}
	})
}
