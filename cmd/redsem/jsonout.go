//go:build unix

package main

import (
	"encoding/json"
	"io"
	"strconv"
	"time"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/rate"
)

// The --json forms of status, check, rate status, top and check --all. One
// style for all, and stable: every document about a name starts with
// "kind" (semaphore, mutex, rwmutex, rate; none for a name that does not
// exist), "name" and "exists"; keys are snake_case; lists are arrays, never
// null; a slot is a number (1..size); times are RFC 3339 strings of Redis
// TIME; durations are whole milliseconds in keys ending in _ms; tokens are
// strings "<epoch>:<slot>".

// noneJSON is status --json of a name that does not exist.
type noneJSON struct {
	Kind   string   `json:"kind"` // "none"
	Name   string   `json:"name"`
	Exists bool     `json:"exists"`
	Kinds  []string `json:"kinds"` // with --kind, what else exists
}

// statusJSON is status --json of a semaphore or mutex.
type statusJSON struct {
	Kind      string `json:"kind"` // "semaphore" or "mutex" (size 1)
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
	// Kinds lists every kind under the name by layout ("semaphore" for a
	// mutex too); status fills it in, the fleet documents too.
	Kinds []string `json:"kinds"`
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
	Kinds      []string     `json:"kinds"`
}

type queuedJSON struct {
	Write bool   `json:"write"`
	Label string `json:"label"`
}

func toRWStatusJSON(st admin.RWStatus) rwStatusJSON {
	out := rwStatusJSON{Kind: "rwmutex", Name: st.Name, Exists: st.Exists, Readers: len(st.Readers),
		Writer: st.Writer != nil, Waiting: len(st.Queue), Epoch: st.Epoch, ServerTime: st.ServerTime,
		Holders: []holderJSON{}, Queue: []queuedJSON{}, Kinds: []string{string(admin.KindRWMutex)}}
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
		Kind: semKind(st.Size), Kinds: []string{string(admin.KindSemaphore)}, Name: st.Name, Exists: st.Exists, Size: st.Size, Available: st.Available,
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

// checkJSON is check --json of a semaphore or mutex: admin.Inventory, and
// whether it is healthy.
type checkJSON struct {
	Kind       string    `json:"kind"`
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
		Kind: semKind(inv.Size), Name: inv.Name, Exists: inv.Exists, Healthy: inv.Healthy(), Size: inv.Size, Epoch: inv.Epoch,
		ServerTime: inv.ServerTime, Free: strs(inv.Free), Pending: strs(inv.Pending), Leased: strs(inv.Leased),
		Withheld: strs(inv.Withheld), Retired: strs(inv.Retired), Duplicates: strs(inv.Duplicates),
		Strangers: strs(inv.Strangers), Missing: missing,
	}
}

// rwCheckJSON is check --json of a read-write lock: healthy when its keys
// are readable; what status shows, counted.
type rwCheckJSON struct {
	Kind       string    `json:"kind"` // "rwmutex"
	Name       string    `json:"name"`
	Exists     bool      `json:"exists"`
	Healthy    bool      `json:"healthy"`
	Readers    int       `json:"readers"`
	Writer     bool      `json:"writer"`
	Waiting    int       `json:"waiting"`
	Expired    int       `json:"expired"` // leases past their deadline, not yet reclaimed
	Epoch      string    `json:"epoch"`
	ServerTime time.Time `json:"server_time"`
}

func toRWCheckJSON(st admin.RWStatus) rwCheckJSON {
	out := rwCheckJSON{Kind: kindRWMutex, Name: st.Name, Exists: st.Exists, Healthy: true, Readers: len(st.Readers),
		Writer: st.Writer != nil, Waiting: len(st.Queue), Epoch: st.Epoch, ServerTime: st.ServerTime}
	for _, h := range rwHolders(st) {
		if h.Expired {
			out.Expired++
		}
	}
	return out
}

// electionJSON is an election in check --all --json and top --json. Leader
// is nil when nobody leads; its fence is the term.
type electionJSON struct {
	Kind       string      `json:"kind"` // "election"
	Name       string      `json:"name"`
	Exists     bool        `json:"exists"`
	Healthy    bool        `json:"healthy"`
	Leading    bool        `json:"leading"`
	Term       int64       `json:"term"`
	Value      string      `json:"value"`
	Leader     *holderJSON `json:"leader"`
	Waiting    int         `json:"waiting"`
	Observers  int         `json:"observers"`
	ServerTime time.Time   `json:"server_time"`
	Kinds      []string    `json:"kinds"`
}

func toElectionJSON(st admin.ElectionStatus) electionJSON {
	out := electionJSON{Kind: string(admin.KindElection), Name: st.Name, Exists: st.Exists, Healthy: true,
		Value: st.Value, Waiting: st.Waiting, Observers: st.Observers, ServerTime: st.ServerTime,
		Kinds: []string{string(admin.KindElection)}}
	if h := st.Leader; h != nil {
		out.Leading, out.Term = true, h.Fence
		out.Leader = &holderJSON{Slot: 1, Token: h.Token, Fence: h.Fence, Label: h.Label, Acquired: h.Acquired, Deadline: h.Deadline,
			TTLLeftMs: max(0, h.Deadline.Sub(st.ServerTime).Milliseconds()), Expired: h.Expired}
	}
	return out
}

// rateStatusJSON is status --json (and rate status --json) of a rate gate.
// limit, per_ms, started, due and available are those of its first limit.
type rateStatusJSON struct {
	Kind      string      `json:"kind"` // "rate"
	Name      string      `json:"name"`
	Exists    bool        `json:"exists"`
	Limit     int         `json:"limit"`
	PerMs     int64       `json:"per_ms"`
	Started   int         `json:"started"`
	Due       int         `json:"due"`
	Available int         `json:"available"`
	Waiting   int         `json:"waiting"`
	Stray     int         `json:"stray"`
	Rejected  int64       `json:"rejected"`
	Set       bool        `json:"set"` // rate set wrote the limits: every client follows them
	Limits    []limitJSON `json:"limits"`
	// Changed is when rate set last changed the limits; absent before.
	Changed    *time.Time `json:"changed,omitempty"`
	ServerTime time.Time  `json:"server_time"`
	Kinds      []string   `json:"kinds"`
}

type limitJSON struct {
	N         int   `json:"n"`
	PerMs     int64 `json:"per_ms"`
	Started   int   `json:"started"`
	Due       int   `json:"due"`
	Available int   `json:"available"`
}

func toRateStatusJSON(st rate.Status) rateStatusJSON {
	out := rateStatusJSON{Kind: kindRate, Name: st.Name, Exists: st.Exists, Limit: st.Limit, PerMs: st.Per.Milliseconds(),
		Started: st.Started, Due: st.Due, Available: st.Available, Waiting: st.Waiting, Stray: st.Stray,
		Rejected: st.Rejected, Set: st.Set, Limits: []limitJSON{}, ServerTime: st.ServerTime,
		Kinds: []string{string(admin.KindRate)}}
	if !st.Changed.IsZero() {
		c := st.Changed
		out.Changed = &c
	}
	for _, l := range st.Limits {
		out.Limits = append(out.Limits, limitJSON{N: l.N, PerMs: l.Per.Milliseconds(), Started: l.Started, Due: l.Due, Available: l.Available})
	}
	return out
}

// rateCheckJSON is check --json of a rate gate: healthy when its grant logs
// hold no stray entry.
type rateCheckJSON struct {
	Kind       string      `json:"kind"` // "rate"
	Name       string      `json:"name"`
	Exists     bool        `json:"exists"`
	Healthy    bool        `json:"healthy"`
	Limits     []limitJSON `json:"limits"`
	Waiting    int         `json:"waiting"`
	Stray      int         `json:"stray"`
	ServerTime time.Time   `json:"server_time"`
}

func toRateCheckJSON(st rate.Status) rateCheckJSON {
	s := toRateStatusJSON(st)
	return rateCheckJSON{Kind: kindRate, Name: st.Name, Exists: st.Exists, Healthy: st.Stray == 0, Limits: s.Limits,
		Waiting: st.Waiting, Stray: st.Stray, ServerTime: st.ServerTime}
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

// fleetJSON is top --json: one document per refresh.
type fleetJSON struct {
	Prefix    string       `json:"prefix"`
	Truncated bool         `json:"truncated"`
	Names     []any        `json:"names"` // each with its own server_time
	Failed    []failedJSON `json:"failed"`
	Error     string       `json:"error,omitempty"` // this refresh's read failed: the last fleet read
}

type failedJSON struct {
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	Error string `json:"error"`
}

func toFleetJSON(prefix string, fl admin.Fleet, err error) fleetJSON {
	out := fleetJSON{Prefix: prefix, Truncated: fl.Truncated, Names: []any{}, Failed: []failedJSON{}}
	kinds := map[string][]string{}
	note := func(name string, k admin.Kind) { kinds[name] = append(kinds[name], string(k)) }
	for _, st := range fl.Semaphores {
		note(st.Name, admin.KindSemaphore)
	}
	for _, st := range fl.RWMutexes {
		note(st.Name, admin.KindRWMutex)
	}
	for _, st := range fl.RateGates {
		note(st.Name, admin.KindRate)
	}
	for _, st := range fl.Elections {
		note(st.Name, admin.KindElection)
	}
	for _, st := range fl.Semaphores {
		d := toStatusJSON(st)
		d.Kinds = kinds[st.Name]
		out.Names = append(out.Names, d)
	}
	for _, st := range fl.RWMutexes {
		d := toRWStatusJSON(st)
		d.Kinds = kinds[st.Name]
		out.Names = append(out.Names, d)
	}
	for _, st := range fl.RateGates {
		d := toRateStatusJSON(st)
		d.Kinds = kinds[st.Name]
		out.Names = append(out.Names, d)
	}
	for _, st := range fl.Elections {
		d := toElectionJSON(st)
		d.Kinds = kinds[st.Name]
		out.Names = append(out.Names, d)
	}
	for _, f := range fl.Failed {
		out.Failed = append(out.Failed, failedJSON{Kind: string(f.Kind), Name: f.Name, Error: oneLine(f.Err)})
	}
	if err != nil {
		out.Error = oneLine(err)
	}
	return out
}
