//go:build unix

package main

import (
	"encoding/json"
	"io"
	"strconv"
	"time"

	"github.com/redsem/redsem/admin"
)

// The --json forms of status and check. One style for both, and stable:
// keys are snake_case; lists are arrays, never null; a slot is a number
// (1..size); times are RFC 3339 strings of Redis TIME; durations are whole
// milliseconds in keys ending in _ms; tokens are strings "<epoch>:<slot>".

// statusJSON is status --json.
type statusJSON struct {
	Name      string `json:"name"`
	Exists    bool   `json:"exists"`
	Size      int    `json:"size"`
	Available int    `json:"available"`
	Held      int    `json:"held"`
	Waiting   int    `json:"waiting"`
	Stray     int    `json:"stray"`
	Rejected  int64  `json:"rejected"`
	// IdleExpiryMs and IdleExpiresInMs: WithIdleExpiry's idle time, and
	// how long until an idle semaphore's keys expire (0 while in use).
	IdleExpiryMs    int64        `json:"idle_expiry_ms,omitempty"`
	IdleExpiresInMs int64        `json:"idle_expires_in_ms,omitempty"`
	Epoch           string       `json:"epoch"`
	ServerTime      time.Time    `json:"server_time"`
	Holders         []holderJSON `json:"holders"`
}

type holderJSON struct {
	Slot      int       `json:"slot"`
	Token     string    `json:"token"`
	Fence     int64     `json:"fence"`
	Label     string    `json:"label"`
	Acquired  time.Time `json:"acquired"`
	Deadline  time.Time `json:"deadline"`
	TTLLeftMs int64     `json:"ttl_left_ms"`
	Expired   bool      `json:"expired"`
}

// rwStatusJSON is status --json of a read-write lock: the holder fields of
// statusJSON (held, waiting, holders, with slot 0), and which kind it is.
type rwStatusJSON struct {
	Kind       string       `json:"kind"` // "rwmutex"
	Name       string       `json:"name"`
	Exists     bool         `json:"exists"`
	Held       int          `json:"held"`
	Readers    int          `json:"readers"`
	Writer     bool         `json:"writer"`
	Waiting    int          `json:"waiting"`
	Epoch      string       `json:"epoch"`
	ServerTime time.Time    `json:"server_time"`
	Holders    []holderJSON `json:"holders"` // the writer, then the readers
	Queue      []queuedJSON `json:"queue"`   // oldest first
}

type queuedJSON struct {
	Write bool   `json:"write"`
	Label string `json:"label"`
}

func toRWStatusJSON(st admin.RWStatus) rwStatusJSON {
	out := rwStatusJSON{Kind: "rwmutex", Name: st.Name, Exists: st.Exists, Readers: len(st.Readers),
		Writer: st.Writer != nil, Waiting: len(st.Queue), Epoch: st.Epoch, ServerTime: st.ServerTime,
		Holders: []holderJSON{}, Queue: []queuedJSON{}}
	for _, h := range rwHolders(st) {
		out.Holders = append(out.Holders, holderJSON{
			Token: h.Token, Fence: h.Fence, Label: h.Label, Acquired: h.Acquired, Deadline: h.Deadline,
			TTLLeftMs: max(0, h.Deadline.Sub(st.ServerTime).Milliseconds()), Expired: h.Expired,
		})
	}
	out.Held = len(out.Holders)
	for _, q := range st.Queue {
		out.Queue = append(out.Queue, queuedJSON{Write: q.Write, Label: q.Label})
	}
	return out
}

func toStatusJSON(st admin.Status) statusJSON {
	out := statusJSON{
		Name: st.Name, Exists: st.Exists, Size: st.Size, Available: st.Available,
		Held: len(st.Holders), Waiting: st.Waiting, Stray: st.Stray, Rejected: st.Rejected,
		Epoch: st.Epoch, ServerTime: st.ServerTime, Holders: []holderJSON{},
		IdleExpiryMs: st.IdleExpiry.Milliseconds(), IdleExpiresInMs: st.IdleExpiresIn.Milliseconds(),
	}
	for _, h := range st.Holders {
		out.Holders = append(out.Holders, holderJSON{
			Slot: slotNumber(h.Token), Token: h.Token, Fence: h.Fence, Label: h.Label,
			Acquired: h.Acquired, Deadline: h.Deadline,
			TTLLeftMs: max(0, h.Deadline.Sub(st.ServerTime).Milliseconds()), Expired: h.Expired,
		})
	}
	return out
}

// checkJSON is check --json: admin.Inventory, and whether it is healthy.
type checkJSON struct {
	Name       string    `json:"name"`
	Exists     bool      `json:"exists"`
	Healthy    bool      `json:"healthy"`
	Size       int       `json:"size"`
	Epoch      string    `json:"epoch"`
	ServerTime time.Time `json:"server_time"`
	Free       []string  `json:"free"`
	Pending    []string  `json:"pending"`
	Leased     []string  `json:"leased"`
	Withheld   []string  `json:"withheld"`
	Retired    []string  `json:"retired"`
	Duplicates []string  `json:"duplicates"`
	Strangers  []string  `json:"strangers"`
	Missing    []int     `json:"missing"` // slots whose token is nowhere
}

func toCheckJSON(inv admin.Inventory) checkJSON {
	strs := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	missing := inv.Missing
	if missing == nil {
		missing = []int{}
	}
	return checkJSON{
		Name: inv.Name, Exists: inv.Exists, Healthy: inv.Healthy(), Size: inv.Size, Epoch: inv.Epoch,
		ServerTime: inv.ServerTime, Free: strs(inv.Free), Pending: strs(inv.Pending), Leased: strs(inv.Leased),
		Withheld: strs(inv.Withheld), Retired: strs(inv.Retired), Duplicates: strs(inv.Duplicates),
		Strangers: strs(inv.Strangers), Missing: missing,
	}
}

// slotNumber returns the slot of a token ("3f2a9c0d41be:2" -> 2), or 0 if
// the token has none.
func slotNumber(token string) int {
	n, err := strconv.Atoi(slotOf(token))
	if err != nil || n < 1 {
		return 0
	}
	return n
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
