package redsem

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Status is a consistent snapshot of a semaphore, read in one script.
type Status struct {
	Name   string
	Exists bool // false until the first Acquire creates the semaphore
	Size   int  // as stored in Redis; 0 when it does not exist
	Epoch  string
	// Available counts the valid tokens free now.
	Available int
	// Withheld counts the valid tokens kept off the list while a shrink
	// drains (see Resize): not free, not held.
	Withheld int
	// Holders lists the leases, in the order they were granted.
	Holders []Holder
	// Waiting counts the acquisitions registered as blocked. It may include
	// waits that ended in the last block time plus grace without a grant.
	Waiting int
	// Stray counts list elements that are not valid free tokens (forged,
	// duplicated or of an older epoch); they are dropped when popped.
	Stray int
	// Rejected counts the stray tokens dropped so far.
	Rejected int64
	// IdleExpiry is the idle time stored with the semaphore
	// (WithIdleExpiry); 0: its keys never expire.
	IdleExpiry time.Duration
	// IdleExpiresIn is how long until the keys of an idle semaphore expire
	// (then the next use creates it afresh); 0 while it is in use, or
	// when IdleExpiry is 0.
	IdleExpiresIn time.Duration
	// ServerTime is Redis TIME when the snapshot was taken.
	ServerTime time.Time
}

// Holder is one lease as recorded in Redis. Times are Redis server time.
type Holder struct {
	Token    string
	Fence    int64
	Label    string
	Acquired time.Time
	Deadline time.Time
	// Expired is true when the deadline has passed but no client has
	// reclaimed the token yet.
	Expired bool
}

// Status reads a snapshot of the semaphore. It reports the size stored in
// Redis, whatever size this Semaphore was made with.
func (s *Semaphore) Status(ctx context.Context) (Status, error) {
	vals, err := redis.Values(statusOnce(ctx, s))
	if err != nil {
		return Status{}, s.scriptError("status", err)
	}
	st, err := parseStatus(vals)
	if err != nil {
		return Status{}, fmt.Errorf("redsem: status %q: %w", engine.Printable(s.name), err)
	}
	st.Name = s.name
	return st, nil
}

func statusOnce(ctx context.Context, s *Semaphore) (interface{}, error) {
	v, _, err := engine.Call(ctx, s.pool, engine.Status, s.k.all(5)...)
	return v, err
}

func parseStatus(vals []interface{}) (Status, error) {
	var st Status
	r, err := engine.ParseStatus(vals)
	if err != nil {
		return st, err
	}
	nowUs, toks, leases := r.NowUs, r.Tokens, r.Leases
	st.ServerTime = time.UnixMicro(nowUs)
	st.Waiting = r.Waiting
	m := r.Meta
	if len(m) > 0 {
		st.Exists = true
		st.Size, _ = strconv.Atoi(m["size"])
		st.Epoch = m["epoch"]
		st.Rejected, _ = strconv.ParseInt(m["rejected"], 10, 64)
		st.Withheld, _ = strconv.Atoi(m["held"])
		idle, _ := strconv.ParseInt(m["idle"], 10, 64)
		st.IdleExpiry = time.Duration(idle) * time.Millisecond
		if exp, err := strconv.ParseInt(m["exp"], 10, 64); err == nil && exp*1000 > nowUs {
			st.IdleExpiresIn = time.Duration(exp*1000-nowUs) * time.Microsecond
		}
	}
	deadlines := map[string]int64{}
	for i := 0; i+1 < len(leases); i += 2 {
		d, _ := strconv.ParseFloat(leases[i+1], 64)
		deadlines[leases[i]] = int64(d)
	}
	h := r.Holders
	for tok, dl := range deadlines {
		rec := strings.SplitN(h["t:"+tok], "|", 4)
		hd := Holder{Token: tok, Deadline: time.UnixMilli(dl), Expired: dl <= nowUs/1000}
		if len(rec) == 4 {
			hd.Fence, _ = strconv.ParseInt(rec[1], 10, 64)
			ms, _ := strconv.ParseInt(rec[2], 10, 64)
			hd.Acquired = time.UnixMilli(ms)
			hd.Label = rec[3]
		}
		st.Holders = append(st.Holders, hd)
	}
	sort.Slice(st.Holders, func(i, j int) bool {
		a, b := st.Holders[i], st.Holders[j]
		// The k tokens of a weighted lease share a fence: order them by token.
		return a.Fence < b.Fence || a.Fence == b.Fence && a.Token < b.Token
	})
	seen := map[string]bool{}
	for _, tok := range toks {
		if st.Exists && engine.ValidToken(tok, st.Epoch, st.Size) && !seen[tok] && deadlines[tok] == 0 {
			seen[tok] = true
			st.Available++
			continue
		}
		st.Stray++
	}
	return st, nil
}
