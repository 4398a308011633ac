package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// ElectionStatus is a snapshot of a leader election (redsem.Election) as
// recorded in Redis.
type ElectionStatus struct {
	Name   string
	Exists bool // false until the first Campaign
	// Leader is the leadership's lease (Fence is its term, Label the
	// leader's WithLabel); nil when nobody leads: no claim announced, or the
	// announced leader's lease gone or past its deadline.
	Leader     *Holder
	Value      string // what the leader announced; "" when nobody leads
	Waiting    int    // campaigners registered as waiting
	Observers  int    // observers registered (Election.Observe)
	ServerTime time.Time
}

// ElectionStatus reads the election of the Handle's name (its keys are under
// <prefix>{<name>}:el:, apart from a semaphore's), in two calls that write
// nothing: the election's mutex by status.lua, then its leader record and
// observers. Errors: ErrWrongType, or a connection error.
func (h *Handle) ElectionStatus(ctx context.Context) (ElectionStatus, error) {
	b := h.base + "el:"
	v, _, err := engine.Call(ctx, h.pool, engine.Status.With(
		[]interface{}{b + "meta", b + "tokens", b + "leases", b + "holders", b + "waits"}, engine.NoArgs{}))
	vals, err := redis.Values(v, err)
	if err != nil {
		return ElectionStatus{}, engine.ScriptError("status", "election", h.name, err)
	}
	r, err := engine.ParseStatus(vals)
	if err != nil {
		return ElectionStatus{}, fmt.Errorf("redsem: status of election %q: %w", engine.Printable(h.name), err)
	}
	if why := corruption(b+"meta", r); why != "" {
		return ElectionStatus{}, engine.ScriptError("status", "election", h.name, redis.Error("REDSEM_CORRUPT "+why))
	}
	mu := parseStatus(r)
	st := ElectionStatus{Name: h.name, Exists: mu.Exists, Waiting: mu.Waiting, ServerTime: mu.ServerTime}
	conn, err := h.pool.GetContext(ctx)
	if err != nil {
		return ElectionStatus{}, err
	}
	defer conn.Close()
	rec, err := redis.Strings(redis.DoContext(conn, ctx, "HMGET", b+"leader", "acq", "value"))
	if err != nil {
		return ElectionStatus{}, engine.ScriptError("status", "election", h.name, err)
	}
	nowMs := r.NowUs / 1000
	obs, err := redis.Strings(redis.DoContext(conn, ctx, "ZRANGEBYSCORE", b+"observers", nowMs, "+inf"))
	if err != nil {
		return ElectionStatus{}, engine.ScriptError("status", "election", h.name, err)
	}
	st.Observers = len(obs)
	if acq := rec[0]; acq != "" {
		tok := r.Holders["a:"+acq]
		for i, hd := range mu.Holders {
			if hd.Token == tok && !hd.Expired {
				st.Leader, st.Value = &mu.Holders[i], rec[1]
			}
		}
	}
	return st, nil
}
