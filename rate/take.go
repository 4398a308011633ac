package rate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// localWake is how close to its wake-up time the queue's head stops sleeping
// in BLPOP and sleeps on a local timer instead: Redis times blocking commands
// out on its cron tick (1/hz, 100ms by default), far too coarse for a rate.
const localWake = 250 * time.Millisecond

// parseRateReply decodes a reply of rate_take.lua or rate_abort.lua:
// {1, grantUs, waitUs, nowUs} granted (Block: until another as large may
// start), {0, waitUs, nowUs, head} waiting, {code, waitUs, nowUs} otherwise.
func parseRateReply(v interface{}, err error) (engine.Reply, error) {
	vals, err := redis.Int64s(v, err)
	if err != nil {
		return engine.Reply{}, err
	}
	switch {
	case len(vals) == 4 && vals[0] == engine.CodeGranted:
		return engine.Reply{Code: vals[0], GrantUs: vals[1], Block: usDuration(vals[2]), NowUs: vals[3]}, nil
	case len(vals) == 4 && vals[0] == engine.CodeWaiting:
		return engine.Reply{Code: vals[0], Block: usDuration(vals[1]), NowUs: vals[2], Head: vals[3] == 1}, nil
	case len(vals) == 3:
		return engine.Reply{Code: vals[0], Block: usDuration(vals[1]), NowUs: vals[2]}, nil
	}
	return engine.Reply{}, fmt.Errorf("unexpected reply %v", vals)
}

// takeCall is rate_take.lua's call for acquisition acq of units.
func (q *Quota) takeCall(acq string, blockUs int64, phase string, units []int) engine.Run {
	var rest []interface{}
	for i, l := range q.limits {
		rest = append(rest, l.N, l.Per.Microseconds(), units[i])
	}
	return engine.RateTake.With(q.k.args(acq), engine.RateTakeArgs{AcqID: acq, BlockUs: blockUs,
		GraceUs: q.cfg.grace.Microseconds(), TombUs: q.tomb().Microseconds(), Phase: phase,
		IdleMs: q.cfg.idle.Milliseconds(), Limits: len(q.limits), Each: rest})
}

// tomb is how long an aborted acquisition's tombstone lives: longer than any
// of its scripts can still be on the way.
func (q *Quota) tomb() time.Duration { return engine.MaxBlock + engine.BlockSlack + q.cfg.grace }

// takeUnits is the driver's protocol for one start of a quota:
// rate_take.lua, behind BLPOP on the waiter's doorbell, and rate_abort.lua.
type takeUnits struct {
	q     *Quota
	units []int
}

func (p *takeUnits) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (engine.Reply, error) {
	return parseRateReply(engine.RunScript(ctx, conn, p.q.takeCall(acq, block.Microseconds(), "fresh", p.units)))
}

// Wait waits as rate_take.lua said, then runs it again (phase "wait"). A
// waiter sleeps in BLPOP on its doorbell with the script right behind it in
// the same write, so the script runs the moment the doorbell rings. The
// queue's head sleeps its last localWake on a local timer, because Redis
// times BLPOP out only on its cron tick.
func (p *takeUnits) Wait(ctx context.Context, conn redis.Conn, acq string, r engine.Reply, next time.Duration) (engine.Reply, error) {
	q := p.q
	take := q.takeCall(acq, next.Microseconds(), "wait", p.units)
	d := r.Block
	if r.Head && d <= localWake {
		engine.Clk.WaitOrDone(ctx, nil, d)
		if err := ctx.Err(); err != nil {
			return engine.Reply{}, err
		}
		return parseRateReply(engine.RunScript(ctx, conn, take))
	}
	if r.Head {
		d -= localWake
	}
	return parseRateReply(engine.BlockThenRun(ctx, conn, d, engine.BLPOP(q.k.inbox(acq)), take))
}

// Abort runs rate_abort.lua (idempotent: it settles by acquisition id),
// once more on another connection if the pooled one was dead.
func (p *takeUnits) Abort(ctx context.Context, acq, mode string) (engine.Reply, error) {
	q := p.q
	v, _, err := engine.Call(ctx, q.pool, engine.RateAbort.With(q.k.args(acq),
		engine.RateAbortArgs{AcqID: acq, Mode: mode, TombUs: q.tomb().Microseconds()}))
	return parseRateReply(v, err)
}

// Accept takes every grant: a start has no lease to outlive.
func (p *takeUnits) Accept(context.Context, string, engine.Reply, time.Time) bool { return true }

func (p *takeUnits) fail(err error) error {
	if engine.IsRedisError(err) {
		return p.q.scriptError("wait", err)
	}
	return fmt.Errorf("redsem: rate gate %q: %w", engine.Printable(p.q.name), err)
}

// scriptError maps the rate scripts' error replies to the package's errors.
func (q *Quota) scriptError(op string, err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		f := strings.Fields(string(re))
		switch {
		case len(f) > 0 && f[0] == "REDSEM_RATE":
			return &MismatchError{Name: q.name, Want: q.Limits(), Stored: parseLimits(f[1:])}
		case len(f) == 5 && f[0] == "REDSEM_TOOLARGE":
			i, _ := strconv.Atoi(f[1])
			asked, _ := strconv.Atoi(f[2])
			l := parseLimits([]string{"1", f[3], f[4]})
			e := &TooLargeError{Name: q.name, Index: i - 1, Units: asked}
			if len(l) == 1 {
				e.Limit = l[0]
			}
			return e
		}
	}
	// The common mapping covers the rest (wrong type, corrupt state).
	return engine.ScriptError(op, "rate gate", q.name, err)
}

// parseLimits reads "<L> <n> <perUs> ..." as the scripts write limits.
func parseLimits(f []string) []Limit {
	if len(f) == 0 {
		return nil
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 0 || len(f) != 1+2*n {
		return nil
	}
	out := make([]Limit, n)
	for i := range out {
		out[i].N, _ = strconv.Atoi(f[1+2*i])
		us, _ := strconv.ParseInt(f[2+2*i], 10, 64)
		out[i].Per = usDuration(us)
	}
	return out
}

func usDuration(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
