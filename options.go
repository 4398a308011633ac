package redsem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Defaults and limits.
const (
	// DefaultTTL is the lease TTL unless WithTTL says otherwise.
	DefaultTTL = 30 * time.Second
	// DefaultGrace is the pending grace unless WithGrace says otherwise.
	DefaultGrace = 5 * time.Second
	// DefaultPrefix starts every key unless WithPrefix says otherwise.
	DefaultPrefix = "redsem:"
	// MaxSize is the largest size a semaphore may have.
	MaxSize = 10000
	// MaxNameLen is the longest name, in bytes, before encoding.
	MaxNameLen = 512
	// MaxLabelLen is the longest holder label, in bytes.
	MaxLabelLen = 256
	// MaxTTL is the longest lease TTL.
	MaxTTL = 7 * 24 * time.Hour

	maxPrefixLen = 128
	// maxBlock caps one blocking wait; a wait that long starts over with a
	// new BLMOVE. The connection's read timeout should be 0 or above
	// maxBlock+blockSlack.
	maxBlock   = 30 * time.Second
	blockSlack = 2 * time.Second
	minBlock   = 10 * time.Millisecond
)

// Option configures a Semaphore, Mutex or RateGate. A RateGate takes
// WithPrefix, WithGrace and WithBlockingPool and refuses the lease options
// (WithTTL, WithAutoRefresh, WithLabel).
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix      string
	ttl         time.Duration
	grace       time.Duration
	label       string
	autoRefresh bool
	blockPool   Pool
	waitConns   int // blocking calls shared by a Semaphore's waiters; 0: one per waiter
	adoptSize   bool
	observer    Observer
}

// WithPrefix sets the prefix of every key of the semaphore. Default
// DefaultPrefix ("redsem:"). It may be empty, must be at most 128 bytes and
// must not contain '{' or '}' (the name's hash tag follows it).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if len(prefix) > maxPrefixLen || strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("%w: prefix %q must be at most %d bytes without braces", ErrInvalidOption, prefix, maxPrefixLen)
		}
		c.prefix = prefix
		return nil
	})
}

// WithTTL sets the lease TTL: how long a lease lives on the server without a
// Refresh. A holder that crashes gives its token back within about one TTL.
// Default DefaultTTL (30s); it must be between 1ms and MaxTTL.
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
	if ttl < time.Millisecond || ttl > MaxTTL {
		return fmt.Errorf("%w: %v is not between 1ms and %v", ErrInvalidTTL, ttl, MaxTTL)
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
		if grace < 0 || grace > time.Hour {
			return fmt.Errorf("%w: grace %v is not between 0 and 1h", ErrInvalidOption, grace)
		}
		c.grace = grace
		return nil
	})
}

// WithLabel sets the holder label recorded with every lease and shown by
// Status, e.g. a host name and pid. Default "<hostname>:<pid>". At most
// MaxLabelLen bytes.
func WithLabel(label string) Option {
	return optionFunc(func(c *config) error {
		if len(label) > MaxLabelLen {
			return fmt.Errorf("%w: label longer than %d bytes", ErrInvalidOption, MaxLabelLen)
		}
		c.label = label
		return nil
	})
}

// WithAutoRefresh makes every lease refresh itself in the background, each
// time a third of its TTL has passed, until it is released or lost. Off by
// default. Release stops it, whatever Release returns.
func WithAutoRefresh() Option {
	return optionFunc(func(c *config) error {
		c.autoRefresh = true
		return nil
	})
}

// WithBlockingPool makes Acquire take the connection it blocks on from pool
// instead of the semaphore's main pool. Every blocked Acquire holds one
// connection for as long as it waits; a separate pool keeps waiters from
// starving Release and Refresh of connections. Default: the main pool.
func WithBlockingPool(pool Pool) Option {
	return optionFunc(func(c *config) error {
		if pool == nil {
			return fmt.Errorf("%w: nil blocking pool", ErrInvalidOption)
		}
		c.blockPool = pool
		return nil
	})
}

// WithAdoptSize makes Acquire and TryAcquire take the size stored in Redis
// instead of failing with ErrSizeMismatch when it differs from the size given
// to NewSemaphore, so that a long-lived client follows Resize. The size given
// is then used only to create the semaphore if it does not exist yet, and
// Size still returns it (Status and Check report the size in force). Off by
// default. A Mutex made with it stops being one once the semaphore is
// resized above 1.
func WithAdoptSize() Option {
	return optionFunc(func(c *config) error {
		c.adoptSize = true
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
	if len(l) > MaxLabelLen {
		l = l[len(l)-MaxLabelLen:]
	}
	return l
}
