package sentinel

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// conn is a connection to the master. It reports what its errors say about
// the master to its Pool: a connection failure, or an error reply that
// means the node was demoted, makes the Pool ask the sentinels again; the
// latter comes back as a *FailoverError.
type conn struct {
	p     *Pool
	inner redis.Conn
	addr  string
}

func (c *conn) Close() error { return c.inner.Close() }
func (c *conn) Err() error   { return c.inner.Err() }

func (c *conn) Do(cmd string, args ...interface{}) (interface{}, error) {
	v, err := c.inner.Do(cmd, args...)
	return v, c.check(err)
}

func (c *conn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	v, err := redis.DoContext(c.inner, ctx, cmd, args...)
	return v, c.check(err)
}

func (c *conn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	v, err := redis.DoWithTimeout(c.inner, timeout, cmd, args...)
	return v, c.check(err)
}

func (c *conn) Send(cmd string, args ...interface{}) error {
	return c.check(c.inner.Send(cmd, args...))
}
func (c *conn) Flush() error { return c.check(c.inner.Flush()) }

func (c *conn) Receive() (interface{}, error) {
	v, err := c.inner.Receive()
	return v, c.check(err)
}

func (c *conn) ReceiveContext(ctx context.Context) (interface{}, error) {
	v, err := redis.ReceiveContext(c.inner, ctx)
	return v, c.check(err)
}

func (c *conn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	v, err := redis.ReceiveWithTimeout(c.inner, timeout)
	return v, c.check(err)
}

// check classifies err. Ordinary error replies, timeouts and context errors
// pass unchanged and say nothing about the master.
func (c *conn) check(err error) error {
	if err == nil {
		return nil
	}
	var re redis.Error
	if errors.As(err, &re) {
		if !demoted(string(re)) {
			return err
		}
		c.p.stats.connErrors.Add(1)
		c.p.forget(c.addr, true)
		return &FailoverError{Addr: c.addr, Msg: string(re)}
	}
	var ne net.Error
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return err
	}
	c.p.stats.connErrors.Add(1)
	c.p.forget(c.addr, false)
	return err
}

// demoted reports whether an error reply means the node is not a writable
// master any more.
func demoted(msg string) bool {
	word, _, _ := strings.Cut(msg, " ")
	switch word {
	case "READONLY", "UNBLOCKED", "MASTERDOWN":
		return true
	}
	return false
}
