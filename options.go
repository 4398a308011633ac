package redsem

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/redsem/redsem/internal/engine"
)

// Defaults and limits.
const (
	// DefaultTTL is the lease TTL unless WithTTL says otherwise.
	DefaultTTL = 30 * time.Second
	// DefaultGrace is the pending grace unless WithGrace says otherwise.
	DefaultGrace = 5 * time.Second
	// DefaultPrefix starts every key unless WithPrefix says otherwise.
	DefaultPrefix = engine.DefaultPrefix
	// MaxSize is the largest size a semaphore may have.
	MaxSize = engine.MaxSize
	// MaxTTL is the longest lease TTL.
	MaxTTL = engine.MaxTTL
	// MinTTL is the shortest lease TTL. A holder stops relying on its lease
	// a safety margin before Redis's deadline (1% of the TTL plus 2ms, for
	// the clocks' rate difference and Redis TIME's millisecond deadlines),
	// and the lease is also shortened by the round trip that granted it.
	// At 20ms the margin is 2.2ms, and the window left, about 17ms, still
	// covers a few milliseconds of round trip or scheduling delay. Below a
	// few milliseconds the margin is the whole TTL and no grant could ever
	// be used.
	MinTTL = 20 * time.Millisecond

	// maxLabelLen is the longest holder label, in bytes (WithLabel).
	maxLabelLen = 256
	// minIdleExpiry is the shortest idle time WithIdleExpiry takes. A
	// semaphore created again after it expired hands out fences from Redis
	// TIME in µs, which has then moved on by at least the idle time: far
	// more than the fences an earlier epoch can have run ahead of TIME (one
	// per grant, and a grant costs Redis more than a µs).
	minIdleExpiry = 100 * time.Millisecond

	// maxBlock caps one blocking wait; a wait that long starts over with a
	// new BLMOVE. The connection's read timeout should be 0 or above
	// maxBlock+blockSlack.
	maxBlock   = engine.MaxBlock
	blockSlack = engine.BlockSlack
	minBlock   = engine.MinBlock
)

// Option configures a Semaphore or a Mutex. Every With* function of this
// package returns one, and every one applies to both. A rate gate (package
// rate) takes rate.Option instead: passing an Option of this package to
// rate.New does not compile.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix     string
	ttl        time.Duration
	grace      time.Duration
	label      string
	fixedTTL   bool // no auto-refresh (WithFixedTTL)
	refreshSet bool // WithFixedTTL or WithAutoRefresh was given
	blockPool  Pool
	waitConns  int  // blocking calls shared by a Semaphore's waiters; 0: one per waiter
	waitSet    bool // WithWaitConnections was given
	adoptSize  bool
	observer   Observer
	idle       time.Duration // WithIdleExpiry; 0: off
}

// WithPrefix sets the prefix of every key of the semaphore. Default
// DefaultPrefix ("redsem:"). It may be empty, must be at most 128 bytes and
// must not contain '{' or '}' (the name's hash tag follows it).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		c.prefix = prefix
		return engine.CheckPrefix(prefix)
	})
}

// WithTTL sets the lease TTL: how long a lease lives on the server without a
// Refresh. A holder that crashes gives its token back within about one TTL.
// Default DefaultTTL (30s); it must be between MinTTL (20ms) and MaxTTL,
// or the constructor returns ErrInvalidTTL.
func WithTTL(ttl time.Duration) Option {
	return optionFunc(func(c *config) error {
		if err := checkTTL(ttl); err != nil {
			return err
		}
		c.ttl = ttl
		return nil
	})
}

func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return fmt.Errorf("%w: %v is not between %v and %v", ErrInvalidTTL, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// WithGrace sets how long a token may sit in a waiter's pending list without
// being leased before any client puts it back. This only happens when the
// lease script behind a waiter's BLMOVE did not run (its connection broke
// between the two); the bound on recovery is then the wait's block time plus
// the grace. Default DefaultGrace (5s); it must be between 0 and one hour.
func WithGrace(grace time.Duration) Option {
	return optionFunc(func(c *config) error {
		c.grace = grace
		return engine.CheckGrace(grace)
	})
}

// WithLabel sets the holder label recorded with every lease and shown by
// admin.Handle.Status, e.g. a host name and pid. Default
// "<hostname>:<pid>". At most 256 bytes.
func WithLabel(label string) Option {
	return optionFunc(func(c *config) error {
		if len(label) > maxLabelLen {
			return fmt.Errorf("%w: label longer than %d bytes", ErrInvalidOption, maxLabelLen)
		}
		c.label = label
		return nil
	})
}

// WithFixedTTL makes leases fixed: a lease lives its TTL from the grant and
// is not refreshed in the background; the holder extends it with Refresh, or
// loses it (Lease.Done, Lease.Context) when the TTL runs out. Use it when a
// hold must never outlast the TTL, whatever the holder does, like a lock
// with a lease time. Default: auto-refresh (see WithAutoRefresh).
func WithFixedTTL() Option {
	return optionFunc(func(c *config) error {
		c.fixedTTL, c.refreshSet = true, true
		return nil
	})
}

// WithAutoRefresh makes every lease refresh itself in the background, each
// time a third of its TTL has passed, until it is released or lost, so a
// live holder keeps its lease for as long as it holds it and a crashed one
// (its process gone) loses it within one TTL. This is the default, as with
// Redisson's lock watchdog and etcd's sessions; the option undoes an earlier
// WithFixedTTL. Release stops the refreshing, whatever Release returns; a
// lease dropped without Release is kept until its process exits. A
// refresh that fails is retried every tenth of the TTL (at most every
// second) until the lease's local deadline; then the lease ends
// (ErrLeaseExpired), and a refresh that finds the lease gone ends it with
// ErrLeaseLost.
func WithAutoRefresh() Option {
	return optionFunc(func(c *config) error {
		c.fixedTTL, c.refreshSet = false, true
		return nil
	})
}

// WithBlockingPool makes Acquire take the connection it blocks on from pool
// instead of the semaphore's main pool. Every blocked Acquire holds one
// connection for as long as it waits; a separate pool keeps waiters from
// starving Release and Refresh of connections. Default: the main pool.
func WithBlockingPool(pool Pool) Option {
	return optionFunc(func(c *config) error {
		c.blockPool = pool
		return engine.CheckPool(pool, "blocking pool")
	})
}

// WithAdoptSize makes Acquire and TryAcquire take the size stored in Redis
// instead of failing with ErrSizeMismatch when it differs from the size given
// to NewSemaphore, so that a long-lived client follows a resize (package
// admin). The size given is then used only to create the semaphore if it
// does not exist yet, and Size still returns it (an admin.Handle's Status
// and Check report the size in force). Off by
// default. A Mutex made with it stops being one once the semaphore is
// resized above 1.
func WithAdoptSize() Option {
	return optionFunc(func(c *config) error {
		c.adoptSize = true
		return nil
	})
}

// WithWaitConnections sets how many blocking Redis calls the goroutines
// waiting on one Semaphore share (see wait.go). Default 1. With n = 0 every
// waiting Acquire blocks on a connection of its own, as BLPOP-based
// semaphores usually do: more connections, but Redis itself orders every
// waiter. n must be between 0 and 1024.
func WithWaitConnections(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 || n > 1024 {
			return fmt.Errorf("%w: %d wait connections is not between 0 and 1024", ErrInvalidOption, n)
		}
		c.waitConns, c.waitSet = n, true
		return nil
	})
}

// WithIdleExpiry makes the keys of a semaphore (or a mutex; not an RWMutex) expire once it has been idle
// for d: every token free, no lease, no waiter, no weighted request and no
// shrink draining. Any use before then keeps it, in the same script that
// takes the token or registers the waiter; a use after then creates it
// afresh, with a new epoch and fences above every earlier one, as the first
// use did. A semaphore in use never expires, whatever d. It suits one
// semaphore per tenant or per key, where most names are used now and then
// and would otherwise stay in Redis forever.
//
// The setting is stored with the semaphore by every acquisition (the last
// one's applies) and read by the release that leaves it idle. Default 0:
// off, keys stay until deleted (package admin). d must be 0 or between 100ms
// and MaxTTL, or the constructor returns ErrInvalidOption.
func WithIdleExpiry(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d != 0 && (d < minIdleExpiry || d > MaxTTL) {
			return fmt.Errorf("%w: idle expiry %v is not 0 or between %v and %v", ErrInvalidOption, d, minIdleExpiry, MaxTTL)
		}
		c.idle = d
		return nil
	})
}

// WithObserver makes the Semaphore report its events to o (see Observer).
// Default: none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		c.observer = o
		return nil
	})
}

func buildConfig(opts []Option) (config, error) {
	c := config{
		prefix: DefaultPrefix,
		ttl:    DefaultTTL,
		grace:  DefaultGrace,
		label:  defaultLabel(),
		// One blocking call per semaphore serves all its waiters.
		waitConns: 1,
	}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := o.apply(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

func defaultLabel() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	l := host + ":" + strconv.Itoa(os.Getpid())
	if len(l) > maxLabelLen {
		l = l[len(l)-maxLabelLen:]
	}
	return l
}

// sizeMode is acquire.lua's sizeMode argument: "adopt" makes it take the
// size stored in Redis (WithAdoptSize).
func (s *Semaphore) sizeMode() string {
	if s.cfg.adoptSize {
		return "adopt"
	}
	return "fixed"
}
