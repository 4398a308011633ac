package rate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Status is a consistent snapshot of a rate gate, read in one script.
type Status struct {
	Name   string
	Exists bool // false until the first Wait or Allow creates the gate
	// Limit and Per are the rate stored in Redis: at most Limit starts in
	// any window of length Per. Both 0 when the gate does not exist.
	Limit int
	Per   time.Duration
	// Started counts the starts granted in the last Per: the start tokens
	// whose return time is still ahead. Started+Available+Due == Limit in a
	// healthy gate.
	Started int
	// Due counts start tokens whose return time has passed but that no
	// script has put back on the free list yet (the next Wait or Allow does).
	Due int
	// Available counts the valid start tokens free now.
	Available int
	// Waiting counts the waiters registered in the gate's queue, including
	// those served whose reply is on its way.
	Waiting int
	// Stray counts list elements that are not valid free start tokens.
	Stray int
	// Rejected counts the stray tokens dropped so far.
	Rejected int64
	// ServerTime is Redis TIME when the snapshot was taken.
	ServerTime time.Time
}

// Status reads a snapshot of the gate. It reports the rate stored in Redis,
// whatever rate this Gate was made with, and writes nothing. Errors:
// ErrWrongType, or a connection error.
func (g *Gate) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, g.pool, g.k, g.name)
}

// ReadStatus reads a snapshot of the gate called name under prefix without
// knowing its rate, for tools that inspect gates they did not create
// (redsem.ReadFleet, redsem top). It writes nothing. Errors:
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

// statusScript is the semaphore's status.lua: the gate's keys have the
// semaphore's layout. It is told that the gate keeps its waiters' deadlines
// in µs.
var statusScript = engine.NewScript(5, "status.lua")

func readStatus(ctx context.Context, pool Pool, k keys, name string) (Status, error) {
	v, _, err := engine.Call(ctx, pool, statusScript, append(k.statusArgs(), "us")...)
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

func parseStatus(vals []interface{}) (Status, error) {
	r, err := engine.ParseStatus(vals)
	if err != nil {
		return Status{}, err
	}
	st := Status{ServerTime: time.UnixMicro(r.NowUs), Waiting: r.Waiting}
	nowUs, toks, leases, m := r.NowUs, r.Tokens, r.Leases, r.Meta
	var epoch string
	if len(m) > 0 {
		st.Exists = true
		st.Limit, _ = strconv.Atoi(m["size"])
		perUs, _ := strconv.ParseInt(m["per"], 10, 64)
		st.Per = usDuration(perUs)
		epoch = m["epoch"]
		st.Rejected, _ = strconv.ParseInt(m["rejected"], 10, 64)
	}
	leased := map[string]bool{}
	for i := 0; i+1 < len(leases); i += 2 {
		leased[leases[i]] = true
		back, _ := strconv.ParseFloat(leases[i+1], 64)
		if int64(back) > nowUs {
			st.Started++
		} else {
			st.Due++
		}
	}
	seen := map[string]bool{}
	for _, tok := range toks {
		if st.Exists && engine.ValidToken(tok, epoch, st.Limit) && !seen[tok] && !leased[tok] {
			seen[tok] = true
			st.Available++
			continue
		}
		st.Stray++
	}
	return st, nil
}
