package sentinel

import (
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Option configures a Pool.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	dialOpts     []redis.DialOption // toward data nodes
	sentinelOpts []redis.DialOption // toward sentinels
	maxIdle      int
	maxActive    int
	failoverWait time.Duration
	waitReplicas int
	waitTimeout  time.Duration
}

// Defaults.
const (
	// DefaultMaxIdle is the idle connections kept to the master unless
	// WithPoolSize says otherwise.
	DefaultMaxIdle = 32
	// DefaultFailoverWait is how long GetContext waits for a reachable
	// master unless WithFailoverWait says otherwise.
	DefaultFailoverWait = 30 * time.Second
)

// WithDialOptions adds options to every connection the Pool dials to a data
// node (the master): a password (redis.DialPassword, redis.DialUsername),
// TLS (redis.DialUseTLS, redis.DialTLSConfig; the sentinels name nodes by
// IP address, so set ServerName in the tls.Config), timeouts. The defaults
// are a 5s connect timeout and no read or write timeout: a blocked Acquire
// waits up to 30s in Redis, so a read timeout, if any, must be above 32s.
func WithDialOptions(opts ...redis.DialOption) Option {
	return optionFunc(func(c *config) error {
		c.dialOpts = append(c.dialOpts, opts...)
		return nil
	})
}

// WithSentinelDialOptions adds options to every connection the Pool dials
// to a sentinel: the sentinels' own password (requirepass in
// sentinel.conf), user, TLS. Data node options (WithDialOptions) do not
// apply to sentinels, nor these to data nodes. Default: a 2s connect, read
// and write timeout.
func WithSentinelDialOptions(opts ...redis.DialOption) Option {
	return optionFunc(func(c *config) error {
		c.sentinelOpts = append(c.sentinelOpts, opts...)
		return nil
	})
}

// WithPoolSize sets the idle and the active connection limits of the
// redigo pool of the master. Default DefaultMaxIdle idle, no active limit.
// With maxActive > 0, getting a connection waits for a free one (within the
// caller's context) instead of failing.
func WithPoolSize(maxIdle, maxActive int) Option {
	return optionFunc(func(c *config) error {
		if maxIdle < 0 || maxActive < 0 {
			return fmt.Errorf("redsem/sentinel: negative pool size %d/%d", maxIdle, maxActive)
		}
		c.maxIdle, c.maxActive = maxIdle, maxActive
		return nil
	})
}

// WithFailoverWait bounds how long New and GetContext wait for a reachable
// master (while a failover runs, or while no sentinel answers) before they
// fail with ErrNoMaster; the caller's context bounds them too. Default
// DefaultFailoverWait (30s); it must be between 100ms and 10 minutes.
func WithFailoverWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 100*time.Millisecond || d > 10*time.Minute {
			return fmt.Errorf("redsem/sentinel: failover wait %v: want between 100ms and 10m", d)
		}
		c.failoverWait = d
		return nil
	})
}

// WithWait makes the Pool follow every write command (and every pipeline
// that holds one) with WAIT replicas timeout on the same connection, and
// return an error matching ErrNotReplicated when fewer replicas acknowledged
// it in time. See the package documentation for what this does and does not
// promise. Off by default. replicas must be at least 1 and timeout between
// 1ms and 1s.
func WithWait(replicas int, timeout time.Duration) Option {
	return optionFunc(func(c *config) error {
		if replicas < 1 || timeout < time.Millisecond || timeout > time.Second {
			return fmt.Errorf("redsem/sentinel: WAIT %d %v: want at least 1 replica and a timeout between 1ms and 1s", replicas, timeout)
		}
		c.waitReplicas, c.waitTimeout = replicas, timeout
		return nil
	})
}

func buildConfig(opts []Option) (config, error) {
	c := config{maxIdle: DefaultMaxIdle, failoverWait: DefaultFailoverWait}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("redsem/sentinel: nil option")
		}
		if err := o.apply(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}
