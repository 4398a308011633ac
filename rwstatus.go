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

// RWStatus is a consistent snapshot of an RWMutex, read in one script.
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

// RWWaiter is one waiter of an RWMutex as recorded in Redis.
type RWWaiter struct {
	Write bool // a Lock; false for an RLock
	Label string
}

// Status reads a snapshot of the lock: its readers, its writer and its
// queue. A lease granted to a waiter whose script has not confirmed it yet
// is listed with the deadline of that short grant.
func (m *RWMutex) Status(ctx context.Context) (RWStatus, error) {
	s := m.s
	k := s.k
	// status.lua reads any semaphore-shaped key set: the queue stands in the
	// free list's place.
	v, _, err := engine.Call(ctx, s.pool, engine.Status, k.meta, k.queue(), k.leases, k.holders, k.waits)
	vals, err := redis.Values(v, err)
	if err != nil {
		return RWStatus{}, s.scriptError("status", err)
	}
	r, err := engine.ParseStatus(vals)
	if err != nil {
		return RWStatus{}, fmt.Errorf("redsem: status of rwmutex %q: %w", engine.Printable(s.name), err)
	}
	st := RWStatus{Name: s.name, Exists: len(r.Meta) > 0, Epoch: r.Meta["epoch"], ServerTime: time.UnixMicro(r.NowUs)}
	for i := 0; i+1 < len(r.Leases); i += 2 {
		acq := r.Leases[i]
		dl, _ := strconv.ParseFloat(r.Leases[i+1], 64)
		// "mode|fence|grantedMs|state|label"
		rec := strings.SplitN(r.Holders["h:"+acq], "|", 5)
		h := Holder{Deadline: time.UnixMilli(int64(dl)), Expired: int64(dl) <= r.NowUs/1000}
		if len(rec) == 5 {
			h.Token = st.Epoch + ":" + rec[0]
			h.Fence, _ = strconv.ParseInt(rec[1], 10, 64)
			ms, _ := strconv.ParseInt(rec[2], 10, 64)
			h.Acquired = time.UnixMilli(ms)
			h.Label = rec[4]
		}
		if len(rec) == 5 && rec[0] == "w" {
			w := h
			st.Writer = &w
			continue
		}
		st.Readers = append(st.Readers, h)
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
