package redsem

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

// hookPool wraps a Pool so tests can inject faults into its connections:
// lose a reply after Redis executed the command, or stall a read as a frozen
// process would.
type hookPool struct {
	Pool
	// afterDo runs after a command executed; a non-nil error replaces the
	// reply, as if the connection broke before the reply arrived.
	afterDo func(cmd string, args []interface{}) error
	// beforeReceive runs before a pipelined reply is read.
	beforeReceive func(ctx context.Context)
}

func (p *hookPool) GetContext(ctx context.Context) (redis.Conn, error) {
	c, err := p.Pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	return &hookConn{Conn: c, p: p}, nil
}

type hookConn struct {
	redis.Conn
	p *hookPool
}

var errLostReply = errors.New("test: reply lost")

func (c *hookConn) after(cmd string, args []interface{}, v interface{}, err error) (interface{}, error) {
	if c.p.afterDo != nil {
		if e := c.p.afterDo(cmd, args); e != nil {
			return nil, e
		}
	}
	return v, err
}

func (c *hookConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	v, err := c.Conn.Do(cmd, args...)
	return c.after(cmd, args, v, err)
}

func (c *hookConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	v, err := redis.DoContext(c.Conn, ctx, cmd, args...)
	return c.after(cmd, args, v, err)
}

func (c *hookConn) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	v, err := redis.DoWithTimeout(c.Conn, d, cmd, args...)
	return c.after(cmd, args, v, err)
}

func (c *hookConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	if c.p.beforeReceive != nil {
		c.p.beforeReceive(ctx)
	}
	return redis.ReceiveContext(c.Conn, ctx)
}

func (c *hookConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.Conn, d)
}

// isScript reports whether a command runs the given script.
func isScript(s *redis.Script, cmd string, args []interface{}) bool {
	return cmd == "EVALSHA" && len(args) > 0 && args[0] == s.Hash()
}

// loseReply returns a pool that loses the reply of the next run of script
// (after Redis ran it) while lose is true, and clears lose when it does.
func loseReply(p Pool, script *redis.Script, armed bool) (*hookPool, *atomic.Bool) {
	lose := &atomic.Bool{}
	lose.Store(armed)
	return &hookPool{Pool: p, afterDo: func(cmd string, args []interface{}) error {
		if isScript(script, cmd, args) && lose.Swap(false) {
			return errLostReply
		}
		return nil
	}}, lose
}
