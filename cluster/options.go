package cluster

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
	dialOpts     []redis.DialOption
	newPool      func(addr string) *redis.Pool
	maxIdle      int
	maxActive    int
	maxRedirects int
	waitReplicas int
	waitTimeout  time.Duration
}

// Defaults.
const (
	// DefaultMaxRedirects is how many times one command is redirected or
	// retried unless WithMaxRedirects says otherwise.
	DefaultMaxRedirects = 16
	// DefaultMaxIdle is the idle connections kept per master unless
	// WithPoolSize says otherwise.
	DefaultMaxIdle = 32
)

// WithDialOptions adds options to every connection the Pool dials, to a
// master or to any node it asks for the slot map: a password
// (redis.DialPassword), TLS, timeouts. The defaults are a 5s connect timeout
// and no read or write timeout: a blocked Acquire waits up to 30s in Redis,
// so a read timeout, if any, must be above 32s.
func WithDialOptions(opts ...redis.DialOption) Option {
	return optionFunc(func(c *config) error {
		c.dialOpts = append(c.dialOpts, opts...)
		return nil
	})
}

// WithPoolSize sets the idle and the active connection limits of the
// redigo pool of each master. Default DefaultMaxIdle idle, no active limit.
// With maxActive > 0, getting a connection waits for a free one (within
// the caller's context) instead of failing.
func WithPoolSize(maxIdle, maxActive int) Option {
	return optionFunc(func(c *config) error {
		if maxIdle < 0 || maxActive < 0 {
			return fmt.Errorf("redsem/cluster: negative pool size %d/%d", maxIdle, maxActive)
		}
		c.maxIdle, c.maxActive = maxIdle, maxActive
		return nil
	})
}

// WithNodePool makes the Pool build the redigo pool of each node with
// newPool(addr) instead of its own, for full control of dialing and pooling.
// The Pool closes these pools. WithDialOptions and WithPoolSize do not apply
// to them.
func WithNodePool(newPool func(addr string) *redis.Pool) Option {
	return optionFunc(func(c *config) error {
		if newPool == nil {
			return fmt.Errorf("redsem/cluster: nil node pool constructor")
		}
		c.newPool = newPool
		return nil
	})
}

// WithMaxRedirects bounds how many times one command is redirected (MOVED,
// ASK) or retried after a transient refusal (TRYAGAIN, CLUSTERDOWN, LOADING,
// a failed dial) before its last error is returned. Retries back off from
// 10ms to 500ms. Default DefaultMaxRedirects (16, about 6s of retries);
// it must be between 1 and 1000.
func WithMaxRedirects(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > 1000 {
			return fmt.Errorf("redsem/cluster: max redirects %d is not between 1 and 1000", n)
		}
		c.maxRedirects = n
		return nil
	})
}

// WithWait makes every connection follow each write command (and each
// pipeline that holds one) with WAIT replicas timeout on the same node, and
// return a *NotReplicatedError (ErrNotReplicated) when fewer replicas
// acknowledged it in time. See the package documentation for what this does
// and does not promise. Off by default. replicas must be at least 1 and
// timeout between 1ms and 1s (a blocked Acquire reads its reply within 2s
// of its block time, and WAIT 0 would block forever).
func WithWait(replicas int, timeout time.Duration) Option {
	return optionFunc(func(c *config) error {
		if err := checkWait(replicas, timeout); err != nil {
			return err
		}
		c.waitReplicas, c.waitTimeout = replicas, timeout
		return nil
	})
}

func checkWait(replicas int, timeout time.Duration) error {
	if replicas < 1 || timeout < time.Millisecond || timeout > time.Second {
		return fmt.Errorf("redsem/cluster: WAIT %d %v: want at least 1 replica and a timeout between 1ms and 1s", replicas, timeout)
	}
	return nil
}

func buildConfig(opts []Option) (config, error) {
	c := config{maxIdle: DefaultMaxIdle, maxRedirects: DefaultMaxRedirects}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("redsem/cluster: nil option")
		}
		if err := o.apply(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}
