package redsem

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Pool is where a Semaphore gets its Redis connections. *redis.Pool
// satisfies it. Connections must support context (redis.ConnWithContext) and
// timeouts (redis.ConnWithTimeout), as redigo's own connections do.
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// Semaphore is a counting semaphore of a fixed size shared through Redis: at
// most Size leases exist at any moment, across every process that uses the
// same name, prefix and Redis. A Semaphore holds no Redis state of its own
// and is safe for concurrent use; create one per name and share it.
type Semaphore struct {
	pool   Pool
	block  Pool
	name   string
	size   int
	cfg    config
	k      keys
	offset serverOffset // Redis TIME against this process's clock (lease.go)
	q      waitQueue    // goroutines of this process waiting (tokens.go, shared waiting)
	wake   wakeHint     // when its last wait was to end (tokens.go, Queue)
	// maxBlock caps one blocking wait (ns). It starts at engine.MaxBlock and
	// shrinks when the connection's read timeout turns out to be shorter.
	maxBlock atomic.Int64
	// kind is whose leases this carries: a semaphore's (nil), or an
	// RWMutex's, whose Semaphore only carries the pools, options and
	// clock its leases share with a semaphore's (see rwmutex.go).
	kind *leaseKind
	// observedAs is the kind of its acquisitions to a ContextObserver when
	// it is not "semaphore": "mutex" for a Mutex's, "election" for an
	// Election's.
	observedAs string
}

// NewSemaphore returns the semaphore called name with size tokens, 1 to
// MaxSize. It checks its arguments and does no I/O: the first Acquire
// anywhere creates the semaphore. name may hold any bytes, up to
// 512. A client whose size differs from the one stored in Redis gets
// a *SizeMismatchError from its acquisitions.
func NewSemaphore(pool Pool, name string, size int, opts ...Option) (*Semaphore, error) {
	if err := engine.CheckPool(pool, "pool"); err != nil {
		return nil, err
	}
	if err := engine.CheckName(name); err != nil {
		return nil, err
	}
	if size < 1 || size > MaxSize {
		return nil, fmt.Errorf("%w: %d is not between 1 and %d", ErrInvalidSize, size, MaxSize)
	}
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	s := &Semaphore{pool: pool, block: pool, name: name, size: size, cfg: cfg, k: newKeys(cfg.prefix, name)}
	if cfg.blockPool != nil {
		s.block = cfg.blockPool
	}
	s.maxBlock.Store(int64(engine.MaxBlock))
	return s, nil
}

// Name returns the semaphore's name as given to NewSemaphore.
func (s *Semaphore) Name() string { return s.name }

// Size returns the number of tokens.
func (s *Semaphore) Size() int { return s.size }

// TTL returns the lease TTL new leases get.
func (s *Semaphore) TTL() time.Duration { return s.cfg.ttl }

// keys holds the Redis keys of one semaphore. All of them share the hash tag
// {<encoded name>}, so they live in one Redis Cluster slot and every script
// touches a single slot.
type keys struct {
	base    string // <prefix>{<encoded name>}:
	meta    string // hash: size, epoch, fence, due, tombstones x:<acqID>... (lua/meta.lua lists them)
	tokens  string // list: free tokens
	leases  string // zset: token -> lease deadline (ms, Redis TIME)
	holders string // hash: t:<token> -> record, a:<acqID> -> token
	waits   string // zset: w:<acqID> pending-list sweep deadline, x:<acqID> tombstones
}

func newKeys(prefix, name string) keys {
	return keysAt(engine.KeyBase(prefix, name))
}

// keysAt returns the key set under base.
func keysAt(base string) keys {
	return keys{
		base:    base,
		meta:    base + "meta",
		tokens:  base + "tokens",
		leases:  base + "leases",
		holders: base + "holders",
		waits:   base + "waits",
	}
}

// pend is the list a blocked waiter's BLMOVE moves its token into.
func (k keys) pend(acqID string) string { return k.base + "pend:" + acqID }

// all returns the first n keys in the order the scripts expect them.
func (k keys) all(n int) []interface{} {
	ks := []interface{}{k.meta, k.tokens, k.leases, k.holders, k.waits}
	return ks[:n]
}
