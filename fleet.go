package redsem

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

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
	// KindRate is a rate gate (package rate), under <prefix>{<name>}:rate:meta.
	KindRate Kind = "rate"
)

// Found is one name ScanNames found.
type Found struct {
	Name string
	Kind Kind
}

// Names is what ScanNames found.
type Names struct {
	// Found lists the semaphores, then the rate gates, each sorted by name.
	Found []Found
	// Truncated is true when the scan stopped early: at the limit on names
	// (there are more names under the prefix than Found lists), or at the
	// cap on SCAN calls before the keyspace was walked (there may be more).
	// Which names were left out depends on where they lie in Redis's hash
	// table.
	Truncated bool
}

// DefaultScanLimit is a sensible cap on the names one scan reports.
const DefaultScanLimit = 1000

// DefaultMaxScan is the cap on the SCAN calls of one scan (over all nodes
// of a cluster) that ScanNames and ReadFleet apply: with COUNT 500, about
// 50,000 keys examined, a few tens of milliseconds of server time. A
// keyspace larger than that is not walked whole (Truncated is set): pass a
// larger cap to ScanNamesWithin or ReadFleetWithin, or keep the semaphores
// in a database of their own.
const DefaultMaxScan = 100

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

// ScanNames finds the semaphores (mutexes, weighted semaphores) and rate
// gates under prefix by SCAN over their meta keys: never KEYS, MATCH on the
// prefix, a COUNT of 500 keys per call, at most limit names and at most
// DefaultMaxScan SCAN calls (then Truncated is set and the scan stops), so
// its cost on the server is bounded however large the keyspace. It is
// ScanNamesWithin with DefaultMaxScan. It reads no semaphore state: a name
// is reported when its meta key exists. Key names that are not of the form
// redsem writes (another program's keys that happen to match) are skipped.
//
// On a MultiNodePool (Redis Cluster) every master is scanned. Otherwise the
// pool's connections must all reach one Redis: SCAN cursors are per server.
//
// Errors: ErrInvalidOption for a prefix WithPrefix would refuse or a limit
// below 1; otherwise a connection error or Redis's error reply.
func ScanNames(ctx context.Context, pool Pool, prefix string, limit int) (Names, error) {
	return ScanNamesWithin(ctx, pool, prefix, limit, DefaultMaxScan)
}

// ScanNamesWithin is ScanNames with at most maxScan SCAN calls in all
// (about 500 keys examined each), instead of DefaultMaxScan. Errors:
// ErrInvalidOption for a maxScan below 1, and those of ScanNames.
func ScanNamesWithin(ctx context.Context, pool Pool, prefix string, limit, maxScan int) (Names, error) {
	if pool == nil {
		return Names{}, fmt.Errorf("%w: nil pool", ErrInvalidOption)
	}
	if err := engine.CheckPrefix(prefix); err != nil {
		return Names{}, err
	}
	if limit < 1 {
		return Names{}, fmt.Errorf("%w: scan limit %d is below 1", ErrInvalidOption, limit)
	}
	if maxScan < 1 {
		return Names{}, fmt.Errorf("%w: max SCAN calls %d is below 1", ErrInvalidOption, maxScan)
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
			return a.Kind == KindSemaphore
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
// <prefix>{<encoded name>}:meta or <prefix>{<encoded name>}:rate:meta,
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
	case ":rate:meta":
		kind = KindRate
	default:
		return Found{}, false
	}
	name, ok := engine.DecodeName(enc)
	if !ok || engine.CheckName(name) != nil {
		return Found{}, false
	}
	return Found{Name: name, Kind: kind}, true
}

// Fleet is a snapshot of every semaphore and rate gate under one prefix.
// Each one is read in one script call and is consistent on its own; the
// fleet as a whole is not one atomic view.
type Fleet struct {
	Semaphores []Status
	RateGates  []rate.Status
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

// ReadFleet finds the names under prefix with ScanNames (at most limit
// names, at most DefaultMaxScan SCAN calls) and reads each one's state in
// one script call: Status for a semaphore, rate.ReadStatus for a rate gate.
// A name deleted between the scan and its read is left out. A name whose keys Redis refuses to read (ErrWrongType,
// ErrCorrupt, another error reply) goes to Failed; any other error (a
// connection error, ctx's end) stops the read and is returned.
func ReadFleet(ctx context.Context, pool Pool, prefix string, limit int) (Fleet, error) {
	return ReadFleetWithin(ctx, pool, prefix, limit, DefaultMaxScan)
}

// ReadFleetWithin is ReadFleet with at most maxScan SCAN calls, as
// ScanNamesWithin. One call sends at most maxScan SCAN calls and one script
// call per name found.
func ReadFleetWithin(ctx context.Context, pool Pool, prefix string, limit, maxScan int) (Fleet, error) {
	names, err := ScanNamesWithin(ctx, pool, prefix, limit, maxScan)
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
		case KindRate:
			var st rate.Status
			st, err = rate.ReadStatus(ctx, pool, prefix, f.Name)
			if err == nil && st.Exists {
				fl.RateGates = append(fl.RateGates, st)
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, ErrWrongType) || errors.Is(err, ErrCorrupt) || engine.IsRedisError(err) {
			fl.Failed = append(fl.Failed, FleetError{Name: f.Name, Kind: f.Kind, Err: err})
			continue
		}
		return Fleet{}, err
	}
	return fl, nil
}

func readSemaphore(ctx context.Context, pool Pool, prefix, name string) (Status, error) {
	a, err := NewAdmin(pool, prefix, name)
	if err != nil {
		return Status{}, err
	}
	return a.Status(ctx)
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
