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
	prefix    string
	ttl       time.Duration
	grace     time.Duration
	label     string
	fixedTTL  bool // no auto-refresh (WithFixedTTL)
	blockPool Pool
	waitConns int  // blocking calls shared by a Semaphore's waiters; 0: one per waiter
	waitSet   bool // WithWaitConnections was given
	adoptSize bool
	observer  Observer
	idle      time.Duration // WithIdleExpiry; 0: off
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

// WithGrace sets how long a token may sit in a waiter's pending list, when
// the script behind its BLMOVE never ran (the connection broke between the
// two), before any client puts it back. Default DefaultGrace (5s); 0 to 1h.
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

// WithFixedTTL makes leases live their TTL from the grant, with no
// background refresh: the holder extends a lease with Refresh or loses it.
// Default: auto-refresh (WithAutoRefresh).
func WithFixedTTL() Option {
	return optionFunc(func(c *config) error {
		c.fixedTTL = true
		return nil
	})
}

// WithAutoRefresh makes every lease refresh itself each time a third of its
// TTL has passed, until Release or until a refresh finds it lost; a failed
// refresh is retried until the local deadline. This is the default; the
// option undoes an earlier WithFixedTTL.
func WithAutoRefresh() Option {
	return optionFunc(func(c *config) error {
		c.fixedTTL = false
		return nil
	})
}

// WithBlockingPool makes blocked acquisitions take their connections from
// pool, so that waiters never starve Release and Refresh of connections.
// Default: the main pool.
func WithBlockingPool(pool Pool) Option {
	return optionFunc(func(c *config) error {
		c.blockPool = pool
		return engine.CheckPool(pool, "blocking pool")
	})
}

// WithAdoptSize makes acquisitions use the size stored in Redis instead of
// failing with ErrSizeMismatch, so a long-lived client follows a resize; the
// size given to NewSemaphore then only creates the semaphore. Off by
// default.
func WithAdoptSize() Option {
	return optionFunc(func(c *config) error {
		c.adoptSize = true
		return nil
	})
}

// WithWaitConnections sets how many blocking Redis calls the goroutines
// waiting on one Semaphore share, 0 to 1024. Default 1; with 0 every
// waiting Acquire blocks on a connection of its own.
func WithWaitConnections(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 || n > 1024 {
			return fmt.Errorf("%w: %d wait connections is not between 0 and 1024", ErrInvalidOption, n)
		}
		c.waitConns, c.waitSet = n, true
		return nil
	})
}

// WithIdleExpiry makes a semaphore's keys (not an RWMutex's) expire once it
// has been idle for d: no lease, no waiter. Any use before then keeps them;
// a use after creates the semaphore afresh, fences above every earlier one.
// Default 0: off. d is 0 or between 100ms and MaxTTL.
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
