package rate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Status is a consistent snapshot of a gate or quota, read in one script.
type Status struct {
	Name   string
	Exists bool // false until the first start or SetRate creates the gate
	// Limit, Per, Started, Due and Available are those of the first limit,
	// Limits[0] (a Gate's only one); 0 when the gate does not exist.
	Limit     int
	Per       time.Duration
	Started   int
	Due       int
	Available int
	// Limits are every limit's, in order, as stored in Redis.
	Limits []LimitStatus
	// Set is true once SetRate or SetLimits wrote the rate: every client
	// follows the stored limits then. Changed is the Redis time the last
	// change took effect (zero before any).
	Set     bool
	Changed time.Time
	// Waiting counts the waiters registered in the gate's queue, including
	// those served whose reply is on its way.
	Waiting int
	// Stray counts entries of the grant logs with no grant record (written
	// by someone else) among the oldest 1000 of each; the next start drops
	// them. Rejected counts those dropped so far.
	Stray    int
	Rejected int64
	// IdleExpiry is the idle time the gate's keys expire after
	// (WithIdleExpiry, as the last start asked; 0: off), and IdleExpiresIn
	// how long from ServerTime until they do if nothing uses the gate
	// meanwhile (0 when off).
	IdleExpiry    time.Duration
	IdleExpiresIn time.Duration
	// ServerTime is Redis TIME when the snapshot was taken.
	ServerTime time.Time
}

// LimitStatus is one limit of a snapshot: the rate stored in Redis, at most
// N units in any window of length Per, and its units now.
type LimitStatus struct {
	Limit
	// Started counts the units granted in the last Per. Due counts units
	// whose window has passed but that no script has let go yet: they are
	// not in Started, and the next start lets them go. Available is what a
	// start may take now, while nobody waits: N less Started, or 0 when a
	// lowered N is below it.
	Started   int
	Due       int
	Available int
}

// Status reads a snapshot of the quota. It reports the limits stored in
// Redis, whatever limits this Quota was made with, and writes nothing.
// Errors: ErrWrongType, or a connection error.
func (q *Quota) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, q.pool, q.k, q.name)
}

// ReadStatus reads a snapshot of the gate or quota called name under prefix
// without knowing its limits, for tools that inspect gates they did not
// create (admin.ReadFleet, redsem top). It writes nothing. Errors:
// ErrInvalidName, ErrInvalidOption (a bad prefix), ErrWrongType, or a
// connection error.
func ReadStatus(ctx context.Context, pool Pool, prefix, name string) (Status, error) {
	if err := engine.CheckName(name); err != nil {
		return Status{}, err
	}
	if err := engine.CheckPrefix(prefix); err != nil {
		return Status{}, err
	}
	return readStatus(ctx, pool, newKeys(prefix, name), name)
}

func readStatus(ctx context.Context, pool Pool, k keys, name string) (Status, error) {
	v, _, err := engine.Call(ctx, pool, engine.RateStatus.With(k.state(), engine.NoArgs{}))
	vals, err := redis.Values(v, err)
	if err != nil {
		return Status{}, engine.ScriptError("status", "rate gate", name, err)
	}
	st, err := parseStatus(vals)
	if err != nil {
		return Status{}, fmt.Errorf("redsem: status rate gate %q: %w", engine.Printable(name), err)
	}
	st.Name = name
	return st, nil
}

// parseStatus reads rate_status.lua's reply: {nowUs, metaFlat, waiting,
// {used, due, stray} per limit}.
func parseStatus(vals []interface{}) (Status, error) {
	if len(vals) < 3 {
		return Status{}, fmt.Errorf("unexpected status reply %v", vals)
	}
	nowUs, err := redis.Int64(vals[0], nil)
	if err != nil {
		return Status{}, err
	}
	flat, err := redis.Strings(vals[1], nil)
	if err != nil {
		return Status{}, err
	}
	waiting, err := redis.Int(vals[2], nil)
	if err != nil {
		return Status{}, err
	}
	m := engine.Pairs(flat)
	st := Status{ServerTime: time.UnixMicro(nowUs), Waiting: waiting, Exists: len(m) > 0}
	st.Rejected, _ = strconv.ParseInt(m["rejected"], 10, 64)
	st.Set = m["set"] == "1"
	if us, err := strconv.ParseInt(m["changed"], 10, 64); err == nil {
		st.Changed = time.UnixMicro(us)
	}
	if ms, err := strconv.ParseInt(m["idle"], 10, 64); err == nil {
		st.IdleExpiry = time.Duration(ms) * time.Millisecond
	}
	if ms, err := strconv.ParseInt(m["exp"], 10, 64); err == nil {
		st.IdleExpiresIn = max(time.UnixMilli(ms).Sub(st.ServerTime), 0)
	}
	for i, raw := range vals[3:] {
		c, err := redis.Ints(raw, nil)
		if err != nil || len(c) != 3 {
			return Status{}, fmt.Errorf("unexpected status of limit %d: %v", i+1, raw)
		}
		sfx := ""
		if i > 0 {
			sfx = ":" + strconv.Itoa(i+1)
		}
		var ls LimitStatus
		ls.N, _ = strconv.Atoi(m["size"+sfx])
		perUs, _ := strconv.ParseInt(m["per"+sfx], 10, 64)
		ls.Per = usDuration(perUs)
		used, due := c[0], c[1]
		ls.Due = due
		ls.Started = used - due
		ls.Available = max(ls.N-ls.Started, 0)
		st.Stray += c[2]
		st.Limits = append(st.Limits, ls)
	}
	if len(st.Limits) == 0 && st.Exists {
		// A gate of the layout before weighted starts, not upgraded yet: the
		// next start upgrades it.
		st.Limit, _ = strconv.Atoi(m["size"])
		perUs, _ := strconv.ParseInt(m["per"], 10, 64)
		st.Per = usDuration(perUs)
	}
	if len(st.Limits) > 0 {
		f := st.Limits[0]
		st.Limit, st.Per, st.Started, st.Due, st.Available = f.N, f.Per, f.Started, f.Due, f.Available
	}
	return st, nil
}
