package admin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/rate"
)

// Kind says what a name found under a prefix stands for.
type Kind string

const (
	// KindSemaphore is a Semaphore, a Mutex or a weighted semaphore: they
	// share one key layout, <prefix>{<name>}:meta and its siblings.
	KindSemaphore Kind = "semaphore"
	// KindRWMutex is a read-write lock (redsem.RWMutex), under
	// <prefix>{<name>}:rw:meta.
	KindRWMutex Kind = "rwmutex"
	// KindRate is a rate gate (package rate), under <prefix>{<name>}:rate:meta.
	KindRate Kind = "rate"
	// KindElection is a leader election (redsem.Election), under
	// <prefix>{<name>}:el:meta.
	KindElection Kind = "election"
)

// kindOrder is the order ScanNames lists the kinds in.
var kindOrder = map[Kind]int{KindSemaphore: 0, KindRWMutex: 1, KindRate: 2, KindElection: 3}

// Found is one name ScanNames found.
type Found struct {
	Name string
	Kind Kind
}

// Names is what ScanNames found.
type Names struct {
	// Found lists the semaphores, then the read-write locks, then the rate
	// gates, then the elections, each sorted by name.
	Found []Found
	// Truncated is true when the scan stopped early: at the limit on names
	// (there are more names under the prefix than Found lists), or at the
	// cap on SCAN calls before the keyspace was walked (there may be more).
	// Which names were left out depends on where they lie in Redis's hash
	// table.
	Truncated bool
}

// DefaultScanLimit is the cap on the names one scan reports unless
// ScanLimits.Limit says otherwise.
const DefaultScanLimit = 1000

// DefaultMaxScan is the cap on the SCAN calls of one scan (over all nodes
// of a cluster) unless ScanLimits.MaxScan says otherwise: with COUNT 500,
// about 50,000 keys examined, a few tens of milliseconds of server time. A
// larger keyspace is not walked whole (Truncated is set): raise the cap, or
// keep the semaphores in a database of their own.
const DefaultMaxScan = 100

// ScanLimits bound one scan. The zero value is the defaults.
type ScanLimits struct {
	Limit   int // the most names reported; 0: DefaultScanLimit
	MaxScan int // the most SCAN calls, over all nodes; 0: DefaultMaxScan
}

// scanCount is the COUNT hint of each SCAN call: how many keys Redis looks
// at per call, which bounds the work of one call on the server.
const scanCount = 500

// MultiNodePool is implemented by a Pool that spreads keys over several
// Redis nodes, such as cluster.Pool. SCAN walks the keyspace of one node,
// so ScanNames and ReadFleet scan each of these pools (one per master) in
// turn; the scripts that read each name still go through the Pool itself.
type MultiNodePool interface {
	Pool
	MasterPools() ([]*redis.Pool, error)
}

// ScanNames finds the semaphores (mutexes, weighted semaphores), read-write
// locks, rate gates and elections under prefix by SCAN over their meta keys (never KEYS; COUNT 500),
// within lim, so its cost on the server is bounded however large the
// keyspace; it reads no state. On a MultiNodePool every master is scanned.
// Errors: ErrInvalidOption (a bad prefix, a negative limit), a connection
// error or Redis's error reply (a NOPERM for SCAN, which ACLCommands leaves
// out, says to allow +scan).
func ScanNames(ctx context.Context, pool Pool, prefix string, lim ScanLimits) (Names, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return Names{}, err
	}
	if err := engine.CheckPrefix(prefix); err != nil {
		return Names{}, err
	}
	limit, maxScan := lim.Limit, lim.MaxScan
	if limit < 0 || maxScan < 0 {
		return Names{}, fmt.Errorf("%w: scan limits %+v: below 0", engine.ErrInvalidOption, lim)
	}
	if limit == 0 {
		limit = DefaultScanLimit
	}
	if maxScan == 0 {
		maxScan = DefaultMaxScan
	}
	nodes := []Pool{pool}
	if mp, ok := pool.(MultiNodePool); ok {
		masters, err := mp.MasterPools()
		if err != nil {
			return Names{}, fmt.Errorf("redsem: scan %q: %w", prefix, err)
		}
		nodes = nodes[:0]
		for _, m := range masters {
			nodes = append(nodes, m)
		}
	}
	seen := map[Found]bool{}
	var names Names
	budget := maxScan
	for _, node := range nodes {
		full, err := scanNode(ctx, node, prefix, limit, &budget, seen, &names.Found)
		if err != nil {
			return Names{}, fmt.Errorf("redsem: scan %q: %w", prefix, err)
		}
		if full {
			names.Truncated = true
			break
		}
	}
	sort.Slice(names.Found, func(i, j int) bool {
		a, b := names.Found[i], names.Found[j]
		if a.Kind != b.Kind {
			return kindOrder[a.Kind] < kindOrder[b.Kind]
		}
		return a.Name < b.Name
	})
	return names, nil
}

// scanNode scans one server, appending to found what seen does not hold
// yet, and reports whether it stopped early: because limit names were found
// and another was there, or because its SCAN calls used up budget (which it
// decrements) before the server's keyspace was walked.
func scanNode(ctx context.Context, pool Pool, prefix string, limit int, budget *int, seen map[Found]bool, found *[]Found) (bool, error) {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	match := globEscape(prefix) + "{*meta"
	cursor := "0"
	for {
		if *budget <= 0 {
			return true, nil
		}
		*budget--
		vals, err := redis.Values(scan(ctx, conn, cursor, match))
		if err != nil {
			if re, ok := err.(redis.Error); ok && strings.HasPrefix(string(re), "NOPERM") {
				return false, fmt.Errorf("SCAN refused (%w); allow +scan to this user to find the names under a prefix", err)
			}
			return false, err
		}
		var keys []string
		if _, err := redis.Scan(vals, &cursor, &keys); err != nil {
			return false, err
		}
		for _, key := range keys {
			f, ok := parseMetaKey(prefix, key)
			if !ok || seen[f] {
				continue
			}
			if len(*found) == limit {
				return true, nil
			}
			seen[f] = true
			*found = append(*found, f)
		}
		if cursor == "0" {
			return false, nil
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
}

// scan runs one SCAN step under ctx.
func scan(ctx context.Context, conn redis.Conn, cursor, match string) (interface{}, error) {
	if ctx.Done() == nil {
		return conn.Do("SCAN", cursor, "MATCH", match, "COUNT", scanCount)
	}
	return redis.DoContext(conn, ctx, "SCAN", cursor, "MATCH", match, "COUNT", scanCount)
}

// globEscape quotes the characters SCAN's MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// parseMetaKey returns the name and kind of a meta key under prefix:
// <prefix>{<encoded name>}:meta, :rw:meta or :rate:meta,
// with a name that encodeName would have written.
func parseMetaKey(prefix, key string) (Found, bool) {
	rest, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return Found{}, false
	}
	enc, tail, ok := strings.Cut(rest, "}")
	if !ok {
		return Found{}, false
	}
	var kind Kind
	switch tail {
	case ":meta":
		kind = KindSemaphore
	case ":rw:meta":
		kind = KindRWMutex
	case ":rate:meta":
		kind = KindRate
	case ":el:meta":
		kind = KindElection
	default:
		return Found{}, false
	}
	name, ok := engine.DecodeName(enc)
	if !ok || engine.CheckName(name) != nil {
		return Found{}, false
	}
	return Found{Name: name, Kind: kind}, true
}

// Fleet is a snapshot of every semaphore, read-write lock, rate gate and
// election under one prefix. Each one is read in one script call and is consistent
// on its own; the fleet as a whole is not one atomic view.
type Fleet struct {
	Semaphores []Status
	RWMutexes  []RWStatus
	RateGates  []rate.Status
	Elections  []ElectionStatus
	// Failed lists the names whose state could not be read: a key of the
	// wrong type, a corrupt record.
	Failed []FleetError
	// Truncated is ScanNames's: more names exist than the limit let in, or
	// the SCAN cap stopped the scan before the keyspace was walked.
	Truncated bool
}

// FleetError is a name ReadFleet could not read, and why.
type FleetError struct {
	Name string
	Kind Kind
	Err  error
}

// ReadFleet finds the names under prefix with ScanNames (within lim) and
// reads each one's state in one script call: Status for a semaphore,
// RWStatus for a read-write lock, rate.ReadStatus for a rate gate,
// ElectionStatus (two calls) for an election. A name deleted meanwhile is left out; one
// whose keys Redis refuses to read (ErrWrongType, ErrCorrupt, another error
// reply) goes to Failed. Any other error (a connection error, ctx's end)
// stops the read and is returned.
func ReadFleet(ctx context.Context, pool Pool, prefix string, lim ScanLimits) (Fleet, error) {
	names, err := ScanNames(ctx, pool, prefix, lim)
	if err != nil {
		return Fleet{}, err
	}
	fl := Fleet{Truncated: names.Truncated}
	for _, f := range names.Found {
		var err error
		switch f.Kind {
		case KindSemaphore:
			var st Status
			st, err = readSemaphore(ctx, pool, prefix, f.Name)
			if err == nil && st.Exists {
				fl.Semaphores = append(fl.Semaphores, st)
			}
		case KindRWMutex:
			var st RWStatus
			st, err = readRWMutex(ctx, pool, prefix, f.Name)
			if err == nil && st.Exists {
				fl.RWMutexes = append(fl.RWMutexes, st)
			}
		case KindRate:
			var st rate.Status
			st, err = rate.ReadStatus(ctx, pool, prefix, f.Name)
			if err == nil && st.Exists {
				fl.RateGates = append(fl.RateGates, st)
			}
		case KindElection:
			var h *Handle
			var st ElectionStatus
			if h, err = New(pool, prefix, f.Name); err == nil {
				st, err = h.ElectionStatus(ctx)
			}
			if err == nil && st.Exists {
				fl.Elections = append(fl.Elections, st)
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, engine.ErrWrongType) || errors.Is(err, engine.ErrCorrupt) || engine.IsRedisError(err) {
			fl.Failed = append(fl.Failed, FleetError{Name: f.Name, Kind: f.Kind, Err: err})
			continue
		}
		return Fleet{}, err
	}
	return fl, nil
}

func readSemaphore(ctx context.Context, pool Pool, prefix, name string) (Status, error) {
	h, err := New(pool, prefix, name)
	if err != nil {
		return Status{}, err
	}
	return h.Status(ctx)
}

func readRWMutex(ctx context.Context, pool Pool, prefix, name string) (RWStatus, error) {
	h, err := New(pool, prefix, name)
	if err != nil {
		return RWStatus{}, err
	}
	return h.RWStatus(ctx)
}
