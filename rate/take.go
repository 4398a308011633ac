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

// The rate gate's scripts (declared in the engine's registry).
var (
	takeScript   = engine.RateTake
	abortScript  = engine.RateAbort
	setScript    = engine.RateSet
	statusScript = engine.RateStatus
)

// localWake is how close to its wake-up time the queue's head stops sleeping
// in BLPOP and sleeps on a local timer instead: Redis times blocking commands
// out on its cron tick (1/hz, 100ms by default), far too coarse for a rate.
const localWake = 250 * time.Millisecond

// rateReply is a decoded reply of rate_take.lua or rate_abort.lua.
type rateReply struct {
	code    int64 // engine.CodeGranted, CodeWaiting (not granted), CodeSettled (start over), CodeReleased
	grantUs int64
	waitUs  int64 // granted: until another as large may start; waiting: how long to wait
	nowUs   int64
	head    bool
}

func parseRateReply(v interface{}, err error) (rateReply, error) {
	vals, err := redis.Int64s(v, err)
	if err != nil {
		return rateReply{}, err
	}
	var r rateReply
	switch {
	case len(vals) == 4 && vals[0] == engine.CodeGranted:
		r = rateReply{code: vals[0], grantUs: vals[1], waitUs: vals[2], nowUs: vals[3]}
	case len(vals) == 4 && vals[0] == engine.CodeWaiting:
		r = rateReply{code: vals[0], waitUs: vals[1], nowUs: vals[2], head: vals[3] == 1}
	case len(vals) == 3:
		r = rateReply{code: vals[0], waitUs: vals[1], nowUs: vals[2]}
	default:
		return rateReply{}, fmt.Errorf("unexpected reply %v", vals)
	}
	return r, nil
}

// takeArgs are rate_take.lua's keys and arguments for acquisition acq of
// units.
func (q *Quota) takeArgs(acq string, blockUs int64, phase string, units []int) []interface{} {
	var rest []interface{}
	for i, l := range q.limits {
		rest = append(rest, l.N, l.Per.Microseconds(), units[i])
	}
	return engine.Args(takeScript, q.k.args(acq), engine.A("acqID", acq), engine.A("blockUs", blockUs),
		engine.A("graceUs", q.cfg.grace.Microseconds()), engine.A("tombUs", q.tomb().Microseconds()),
		engine.A("phase", phase), engine.A("limits", len(q.limits)), engine.Rest(rest...))
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

func (p *takeUnits) First(ctx context.Context, conn redis.Conn, acq string, block time.Duration) (rateReply, error) {
	return parseRateReply(engine.RunScript(ctx, conn, takeScript, p.q.takeArgs(acq, block.Microseconds(), "fresh", p.units)...))
}

// Wait waits as rate_take.lua said, then runs it again (phase "wait"). A
// waiter sleeps in BLPOP on its doorbell with the script right behind it in
// the same write, so the script runs the moment the doorbell rings. The
// queue's head sleeps its last localWake on a local timer, because Redis
// times BLPOP out only on its cron tick.
func (p *takeUnits) Wait(ctx context.Context, conn redis.Conn, acq string, r rateReply, next time.Duration) (rateReply, error) {
	q := p.q
	args := q.takeArgs(acq, next.Microseconds(), "wait", p.units)
	d := usDuration(r.waitUs)
	if r.head && d <= localWake {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return rateReply{}, ctx.Err()
		case <-t.C:
		}
		return parseRateReply(engine.RunScript(ctx, conn, takeScript, args...))
	}
	if r.head {
		d -= localWake
	}
	return parseRateReply(engine.BlockThenRun(ctx, conn, d, engine.BLPOP(q.k.inbox(acq)),
		takeScript, args, func(err error) error { return q.scriptError("wait", err) }))
}

// Abort runs rate_abort.lua (idempotent: it settles by acquisition id),
// once more on another connection if the pooled one was dead.
func (p *takeUnits) Abort(ctx context.Context, acq, mode string) (rateReply, error) {
	q := p.q
	args := engine.Args(abortScript, q.k.args(acq),
		engine.A("acqID", acq), engine.A("mode", mode), engine.A("tombUs", q.tomb().Microseconds()))
	v, _, err := engine.Call(ctx, q.pool, abortScript, args...)
	return parseRateReply(v, err)
}

func (p *takeUnits) Code(r rateReply) int64 { return r.code }

func (p *takeUnits) Block(r rateReply) time.Duration { return usDuration(r.waitUs) }

func (p *takeUnits) Moves(rateReply) bool { return false }

func (p *takeUnits) Observe(rateReply, time.Time) {}

func (p *takeUnits) Accept(context.Context, string, rateReply, time.Time) (bool, error) {
	return true, nil
}

func (p *takeUnits) Error(err error) error { return p.q.scriptError("wait", err) }

func (p *takeUnits) Wrap(err error) error {
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
