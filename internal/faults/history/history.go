// Package history is the shared record of a fault run: the events client
// processes (of a semaphore, or of a rate gate) append to one file, how
// they write them, and how the keys of a semaphore are named (so that raw
// commands of tests and broken clients hit the same keys as the library).
package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
)

// Event kinds.
const (
	KWait     = "wait"     // an Acquire starts; T0 is Redis TIME just before it
	KAcq      = "acq"      // Acquire returned a lease (T, DL, Valid read after it returned)
	KRelStart = "relstart" // the holder stops using the token; T is TIME, Valid is Lease.Valid() read after it
	KRel      = "rel"      // Release (or the variant's release) returned; Class says how
	KCancel   = "cancel"   // an Acquire ended because its context ended on purpose (storm)
	KStarved  = "starved"  // an Acquire that should have succeeded ran out of time
	KAcqErr   = "acqerr"   // an Acquire failed with another error (Class); the worker retries
	KRevived  = "revived"  // a holder resumed after SIGSTOP and looked at its lease
	KFPKill   = "fpkill"   // the worker kills itself at a failpoint
	KFatal    = "fatal"    // the worker stops on an error it must not retry
	KExit     = "exit"     // the worker finished normally
	// KStart is a start granted by a rate gate (rateworker): T is its grant
	// time (Redis TIME, µs), Units what it took of each limit.
	KStart = "start"
)

// Event is one line of the history file.
type Event struct {
	K string `json:"k"`
	W int    `json:"w"` // worker id given by the test
	// Name is the semaphore of the event when a worker uses several
	// (-names); "" for the one of the run.
	Name string `json:"name,omitempty"`
	Pid  int    `json:"pid"`           // process id
	G    int    `json:"g,omitempty"`   // goroutine index in the process: a holder is (Pid, G)
	S    int    `json:"s,omitempty"`   // per-holder acquisition number, joins acq and rel
	N    int    `json:"n,omitempty"`   // permits asked for (AcquireN), 0 or 1 for Acquire
	Tok  string `json:"tok,omitempty"` // token (the first of Toks)
	// Toks are all the tokens of a lease of several (AcquireN with k > 1),
	// in grant order; empty for a lease of one (Tok).
	Toks  []string `json:"toks,omitempty"`
	Fence int64    `json:"fence,omitempty"` // one fence for all the tokens of a lease
	Units []int    `json:"units,omitempty"` // a rate gate start's units, one count per limit
	T0    int64    `json:"t0,omitempty"`    // Redis TIME (µs) before Acquire
	T     int64    `json:"t,omitempty"`     // Redis TIME (µs)
	DL    int64    `json:"dl,omitempty"`    // lease deadline recorded in Redis (ms of Redis TIME), 0 unknown
	Valid bool     `json:"valid,omitempty"`
	Done  bool     `json:"done,omitempty"`
	Class string   `json:"class,omitempty"` // outcome: ok, lost, released, expired, ctx, conn, wrongtype, ...
	Err   string   `json:"err,omitempty"`
	Mono  int64    `json:"mono,omitempty"`
	// Lag is, for a cancel, how long (µs) Acquire took to return after its
	// context ended: the settling of its wait in Redis.
	Lag int64 `json:"lag,omitempty"` // µs of the process's monotonic clock since its start
}

// Writer appends events to a history file shared by several processes: the
// file is opened with O_APPEND and each event is one write(2) of one line, so
// lines of different processes never interleave.
type Writer struct {
	mu sync.Mutex
	f  *os.File
}

// Open opens (creating it if needed) the history file for appending.
func Open(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// Write appends e as one line.
func (w *Writer) Write(e Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = w.f.Write(b)
	return err
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Read returns the events of a history file, and how many lines it could not
// parse (a process killed mid-write can leave at most a torn last line).
func Read(path string) ([]Event, int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	var (
		evs []Event
		bad int
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil {
			bad++
			continue
		}
		evs = append(evs, e)
	}
	return evs, bad, sc.Err()
}

// Keys are the Redis keys of one semaphore, named as the library names them
// (keys.go): <prefix>{<encoded name>}:<kind>.
type Keys struct {
	Base, Meta, Tokens, Leases, Holders, Waits string
}

// KeysFor returns the keys of the semaphore name under prefix.
func KeysFor(prefix, name string) Keys {
	base := prefix + "{" + EncodeName(name) + "}:"
	return Keys{Base: base, Meta: base + "meta", Tokens: base + "tokens", Leases: base + "leases",
		Holders: base + "holders", Waits: base + "waits"}
}

// RWKeysFor returns the keys of the read-write lock (RWMutex) name under
// prefix: <prefix>{<encoded name>}:rw:<kind>; its leases are keyed by
// acquisition id, its holders hash by "h:<acqID>" (see rw_common.lua).
func RWKeysFor(prefix, name string) Keys {
	k := KeysFor(prefix, name)
	base := k.Base + "rw:"
	return Keys{Base: base, Meta: base + "meta", Leases: base + "leases", Holders: base + "holders", Waits: base + "waits"}
}

// Pend is the pending list of one acquisition.
func (k Keys) Pend(acqID string) string { return k.Base + "pend:" + acqID }

// EncodeName mirrors the library's encodeName: ASCII letters, digits and
// "-_.:/@+=," stand for themselves, every other byte becomes %XX.
func EncodeName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:/@+=,", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}
