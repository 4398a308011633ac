package admin

import (
	"context"
	"fmt"
	"math"
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

// Status reads a snapshot of the semaphore in one script that writes
// nothing. It reports the size stored in Redis. While a weighted request
// collects, the tokens it has so far are holders with Fence 0. Errors:
// ErrWrongType, ErrCorrupt (a meta record of the wrong shape, or tokens or
// leases without one: what an Acquire refuses, in its words), or a
// connection error.
func (h *Handle) Status(ctx context.Context) (Status, error) {
	vals, err := redis.Values(h.call(ctx, "status", engine.Status.With(h.keys(), engine.NoArgs{})))
	if err != nil {
		return Status{}, err
	}
	r, err := engine.ParseStatus(vals)
	if err != nil {
		return Status{}, fmt.Errorf("redsem: status %q: %w", engine.Printable(h.name), err)
	}
	if why := corruption(h.base+"meta", r); why != "" {
		return Status{}, engine.ScriptError("status", "semaphore", h.name, redis.Error("REDSEM_CORRUPT "+why))
	}
	st := parseStatus(r)
	st.Name = h.name
	return st, nil
}

// corruption is why the scripts that acquire would refuse the semaphore
// status.lua read (REDSEM_CORRUPT from meta.lua's read_meta or create, in
// their words), or "" when they would take it. TestHandle_Status_corrupt
// holds the two together.
func corruption(metaKey string, r engine.StatusReply) string {
	m := r.Meta
	size, epoch, fence := m["size"], epochOf(m), m["fence"]
	if size == "" && epoch == "" {
		if len(r.Tokens) > 0 || len(r.Leases) > 0 {
			return metaKey + " is missing but tokens or leases exist"
		}
		return ""
	}
	// read_meta's bounds: a size up to 100000, a fence below FENCE_MAX.
	n, nOK := luaNumber(size)
	f, fOK := luaNumber(fence)
	switch {
	case !nOK || n < 1 || n > 100000 || n != math.Trunc(n) || epoch == "" || !fOK || m["gen"] != "" && m["epoch"] != "":
		return metaKey + " is not a redsem meta record"
	case f >= 9e15:
		return metaKey + " holds fence " + fence + ", too large to grow"
	}
	return ""
}

// epochOf is the epoch meta holds: gen, or epoch for a semaphore of the
// layout before protocol v2, which the next script to read it upgrades
// (meta.lua's upgrade) or refuses.
func epochOf(m map[string]string) string {
	if e := m["gen"]; e != "" {
		return e
	}
	return m["epoch"]
}

// luaNumber is Lua's tonumber for the numbers redsem and strangers write.
func luaNumber(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	if i, err := strconv.ParseInt(s, 0, 64); err == nil {
		return float64(i), true
	}
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil && !math.IsInf(f, 0) && !math.IsNaN(f)
}

// parseStatus reads the snapshot of a semaphore corruption accepts.
func parseStatus(r engine.StatusReply) Status {
	var st Status
	nowUs, toks, leases := r.NowUs, r.Tokens, r.Leases
	st.ServerTime = time.UnixMicro(nowUs)
	st.Waiting = r.Waiting
	m := r.Meta
	if m["size"] != "" || epochOf(m) != "" {
		st.Exists = true
		n, _ := luaNumber(m["size"])
		st.Size = int(n)
		st.Epoch = epochOf(m)
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
	return st
}

// Expired counts the holders whose lease deadline has passed and whose
// token no client has reclaimed yet (the next Acquire, Reclaim or Repair
// does).
func (st Status) Expired() int {
	n := 0
	for _, h := range st.Holders {
		if h.Expired {
			n++
		}
	}
	return n
}

// OldestHold is how long the longest-held lease has been held at
// ServerTime, by Redis time; 0 without holders.
func (st Status) OldestHold() time.Duration {
	var oldest time.Duration
	for _, h := range st.Holders {
		if h.Acquired.IsZero() {
			continue
		}
		oldest = max(oldest, st.ServerTime.Sub(h.Acquired))
	}
	return oldest
}

// RWStatus is a consistent snapshot of a read-write lock (redsem.RWMutex),
// read in one script.
type RWStatus struct {
	Name   string
	Exists bool // false until the first RLock or Lock creates the lock
	Epoch  string
	// Readers lists the read leases, in the order they were granted.
	Readers []Holder
	// Writer is the write lease, if one is out.
	Writer *Holder
	// Queue lists the waiters, oldest (next to be served) first.
	Queue []RWWaiter
	// ServerTime is Redis TIME when the snapshot was taken.
	ServerTime time.Time
}

// RWWaiter is one waiter of a read-write lock as recorded in Redis.
type RWWaiter struct {
	Write bool // a Lock; false for an RLock
	Label string
}

// RWStatus reads a snapshot of the read-write lock of the Handle's name and
// prefix (an RWMutex keeps keys of its own, apart from the semaphore's): its
// readers, its writer and its queue, in one script that writes nothing. A
// lease granted to a waiter whose script has not confirmed it yet is listed
// with the deadline of that short grant. Errors: ErrWrongType, or a
// connection error.
func (h *Handle) RWStatus(ctx context.Context) (RWStatus, error) {
	b := h.base + "rw:"
	// status.lua reads any semaphore-shaped key set: the queue stands in the
	// free list's place.
	v, _, err := engine.Call(ctx, h.pool, engine.Status.With(
		[]interface{}{b + "meta", b + "queue", b + "leases", b + "holders", b + "waits"}, engine.NoArgs{}))
	vals, err := redis.Values(v, err)
	if err != nil {
		return RWStatus{}, engine.ScriptError("status", "rwmutex", h.name, err)
	}
	r, err := engine.ParseStatus(vals)
	if err != nil {
		return RWStatus{}, fmt.Errorf("redsem: status of rwmutex %q: %w", engine.Printable(h.name), err)
	}
	st := RWStatus{Name: h.name, Exists: len(r.Meta) > 0, Epoch: r.Meta["epoch"], ServerTime: time.UnixMicro(r.NowUs)}
	for i := 0; i+1 < len(r.Leases); i += 2 {
		acq := r.Leases[i]
		dl, _ := strconv.ParseFloat(r.Leases[i+1], 64)
		// "mode|fence|grantedMs|state|label"
		rec := strings.SplitN(r.Holders["h:"+acq], "|", 5)
		hd := Holder{Deadline: time.UnixMilli(int64(dl)), Expired: int64(dl) <= r.NowUs/1000}
		if len(rec) == 5 {
			hd.Token = st.Epoch + ":" + rec[0]
			hd.Fence, _ = strconv.ParseInt(rec[1], 10, 64)
			ms, _ := strconv.ParseInt(rec[2], 10, 64)
			hd.Acquired = time.UnixMilli(ms)
			hd.Label = rec[4]
		}
		if len(rec) == 5 && rec[0] == "w" {
			w := hd
			st.Writer = &w
			continue
		}
		st.Readers = append(st.Readers, hd)
	}
	sort.Slice(st.Readers, func(i, j int) bool { return st.Readers[i].Fence < st.Readers[j].Fence })
	for _, acq := range r.Tokens {
		// "mode|ttlMs|graceMs|label"
		rec := strings.SplitN(r.Holders["q:"+acq], "|", 4)
		if len(rec) == 4 {
			st.Queue = append(st.Queue, RWWaiter{Write: rec[0] == "w", Label: rec[3]})
		}
	}
	return st, nil
}
