package rate

import (
	"context"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// Defaults and limits.
const (
	// DefaultPrefix starts every key unless WithPrefix says otherwise; it is
	// redsem.DefaultPrefix, so gates and semaphores of one name share a slot.
	DefaultPrefix = engine.DefaultPrefix
	// DefaultGrace is the waiter grace unless WithGrace says otherwise.
	DefaultGrace = 5 * time.Second
	// MaxN is the most units per interval a limit may admit, and the most
	// units one start may take of it.
	MaxN = 1_000_000_000
	// MaxLimits is the most limits a Quota may have.
	MaxLimits = engine.MaxLimits
	// MaxPer is the longest interval.
	MaxPer = engine.MaxTTL
	// MaxNameLen is the longest name, in bytes, before encoding.
	MaxNameLen = engine.MaxNameLen
	// minIdleExpiry is the shortest idle time WithIdleExpiry takes, a
	// semaphore's: a gate created again after it expired grants from
	// Redis TIME, which has then moved on by at least the idle time.
	minIdleExpiry = 100 * time.Millisecond
)

// Pool is where a Gate gets its Redis connections. *redis.Pool satisfies
// it, as does any redsem.Pool (the same method).
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// Option configures a Gate or Quota. Only the functions of this file return one: the
// semaphore's options (redsem.WithTTL, redsem.WithLabel...) are of another
// type, redsem.Option, and passing one to New does not compile.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix    string
	grace     time.Duration
	blockPool Pool
	observer  Observer
	idle      time.Duration // WithIdleExpiry; 0: off
}

// WithPrefix sets the prefix of every key of the gate. Default
// DefaultPrefix ("redsem:"). It may be empty, must be at most 128 bytes and
// must not contain '{' or '}' (the name's hash tag follows it).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		c.prefix = prefix
		return engine.CheckPrefix(prefix)
	})
}

// WithGrace sets how long past its expected wake-up a silent waiter is still
// kept in the gate's queue: a waiter whose client died is dropped that long
// after it should have come back. Default DefaultGrace (5s); it must be
// between 0 and one hour.
func WithGrace(grace time.Duration) Option {
	return optionFunc(func(c *config) error {
		c.grace = grace
		return engine.CheckGrace(grace)
	})
}

// WithBlockingPool makes Wait take the connection it blocks on from pool
// instead of the gate's main pool. Every waiting Wait holds one connection
// for as long as it waits; a separate pool keeps waiters from starving
// Allow of connections. Default: the main pool.
func WithBlockingPool(pool Pool) Option {
	return optionFunc(func(c *config) error {
		c.blockPool = pool
		return engine.CheckPool(pool, "blocking pool")
	})
}

// WithIdleExpiry makes the gate's keys expire once it has been idle for d:
// one window after its last start (or rate change), with no waiter. Any
// use before then keeps them; a use after creates the gate afresh with the
// rate of the client that uses it, so a rate set at run time (SetRate,
// redsem rate set) lasts only while the gate is in use. Every start writes
// its own setting, so the last one's applies. Default 0: off. d is 0 or
// between 100ms and MaxPer.
func WithIdleExpiry(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d != 0 && (d < minIdleExpiry || d > MaxPer) {
			return fmt.Errorf("%w: idle expiry %v is not 0 or between %v and %v", ErrInvalidOption, d, minIdleExpiry, MaxPer)
		}
		c.idle = d
		return nil
	})
}

// WithObserver makes the gate report each start, granted or not, to o.
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
	c := config{prefix: DefaultPrefix, grace: DefaultGrace}
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
