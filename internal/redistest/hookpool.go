package redistest

import (
	"context"
	"errors"
	"time"

	"github.com/gomodule/redigo/redis"
)

// HookPool wraps a pool so tests can inject faults into its connections:
// lose a reply after Redis executed the command, or stall a read as a frozen
// process would.
type HookPool struct {
	Pool interface {
		GetContext(ctx context.Context) (redis.Conn, error)
	}
	// BeforeDo runs before a command is sent; a non-nil error is returned
	// instead and nothing is sent, as if the link were down.
	BeforeDo func(cmd string, args []interface{}) error
	// AfterDo runs after a command executed; a non-nil error replaces the
	// reply, as if the connection broke before the reply arrived.
	AfterDo func(cmd string, args []interface{}) error
	// BeforeReceive runs before a pipelined reply is read.
	BeforeReceive func(ctx context.Context)
	// ReadPastContext reads a pipelined reply even once its context has
	// ended, as redigo's ReceiveContext does or not at random.
	ReadPastContext bool
}

// GetContext returns a connection of Pool wrapped in the hooks.
func (p *HookPool) GetContext(ctx context.Context) (redis.Conn, error) {
	c, err := p.Pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	return &hookConn{Conn: c, p: p}, nil
}

type hookConn struct {
	redis.Conn
	p *HookPool
}

// ErrLostReply is what an AfterDo returns to lose a reply.
var ErrLostReply = errors.New("test: reply lost")

func (c *hookConn) after(cmd string, args []interface{}, v interface{}, err error) (interface{}, error) {
	if c.p.AfterDo != nil {
		if e := c.p.AfterDo(cmd, args); e != nil {
			return nil, e
		}
	}
	return v, err
}

func (c *hookConn) before(cmd string, args []interface{}) error {
	if c.p.BeforeDo != nil {
		return c.p.BeforeDo(cmd, args)
	}
	return nil
}

func (c *hookConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	if err := c.before(cmd, args); err != nil {
		return nil, err
	}
	v, err := c.Conn.Do(cmd, args...)
	return c.after(cmd, args, v, err)
}

func (c *hookConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if err := c.before(cmd, args); err != nil {
		return nil, err
	}
	v, err := redis.DoContext(c.Conn, ctx, cmd, args...)
	return c.after(cmd, args, v, err)
}

func (c *hookConn) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if err := c.before(cmd, args); err != nil {
		return nil, err
	}
	v, err := redis.DoWithTimeout(c.Conn, d, cmd, args...)
	return c.after(cmd, args, v, err)
}

func (c *hookConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if c.p.BeforeReceive != nil {
		c.p.BeforeReceive(ctx)
	}
	if c.p.ReadPastContext {
		return c.Conn.Receive()
	}
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *hookConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.Conn, d)
}

// IsScript reports whether a command runs the given script (an
// *engine.Script, whose Hash is known once it has run).
func IsScript(s interface{ Hash() string }, cmd string, args []interface{}) bool {
	return cmd == "EVALSHA" && len(args) > 0 && args[0] == s.Hash()
}
