package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// conn is a routing connection. It holds at most one node connection at a
// time (borrowed from that node's pool) and moves to another node when a
// command's key needs it and no pipeline is in flight.
//
// Do and DoContext follow MOVED and ASK (sending ASKING first) and retry
// TRYAGAIN, CLUSTERDOWN and LOADING with backoff, up to the Pool's redirect
// bound: Redis sends these before running the command, so a retry never runs
// it twice. A connection error is returned as is: the command may have run.
//
// A pipeline (Send, Flush, Receive) goes to the node of its first keyed
// command and stays there until every reply is read. A redirection inside it
// is returned as *RedirectError and the rest of the pipeline's replies are
// read at once (so the connection is clean) and handed out in order by later
// Receives.
type conn struct {
	p       *Pool
	addr    string     // node of cur
	cur     redis.Conn // borrowed from p.nodes[addr], or nil
	pending int        // Sends whose replies are still on the wire
	queued  []reply    // replies read ahead after a redirection
	closed  bool
}

type reply struct {
	v   interface{}
	err error
}

// drainTimeout bounds reading the rest of a redirected pipeline.
const drainTimeout = 3 * time.Second

var errConnClosed = errors.New("redsem/cluster: connection closed")

// use points the connection at addr, borrowing a connection from addr's pool
// unless it already holds one.
func (c *conn) use(ctx context.Context, addr string) (redis.Conn, error) {
	if c.cur != nil && c.addr == addr {
		return c.cur, nil
	}
	c.release()
	np, err := c.p.nodePool(addr)
	if err != nil {
		return nil, err
	}
	nc, err := np.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	c.cur, c.addr = nc, addr
	return nc, nil
}

// release gives the node connection back to its pool.
func (c *conn) release() {
	if c.cur != nil {
		c.cur.Close()
		c.cur, c.addr = nil, ""
	}
	c.pending = 0
	c.queued = nil
}

// inPipeline reports whether replies of sent commands are still to be read.
func (c *conn) inPipeline() bool { return c.pending > 0 || len(c.queued) > 0 }

// target picks the node for a command with the given slot (-1: keyless).
func (c *conn) target(slot int) string {
	if slot < 0 && c.cur != nil {
		return c.addr
	}
	return c.p.route(slot)
}

// resolve completes an address of a redirection that has no host.
func (c *conn) resolve(addr string) string {
	if strings.HasPrefix(addr, ":") {
		host, _, _ := net.SplitHostPort(c.addr)
		return host + addr
	}
	return addr
}

func (c *conn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return c.do(context.Background(), nil, 0, cmd, args)
}

func (c *conn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return c.do(ctx, ctx, 0, cmd, args)
}

func (c *conn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	return c.do(context.Background(), nil, timeout, cmd, args)
}

// rawDo runs one command on nc with the caller's context or timeout.
func rawDo(nc redis.Conn, ctx context.Context, timeout time.Duration, cmd string, args []interface{}) (interface{}, error) {
	switch {
	case ctx != nil:
		return redis.DoContext(nc, ctx, cmd, args...)
	case timeout > 0:
		return redis.DoWithTimeout(nc, timeout, cmd, args...)
	default:
		return nc.Do(cmd, args...)
	}
}

// do runs a command, following redirections. bctx bounds dials and backoff;
// ctx (nil for Do and DoWithTimeout) is passed to the node connection.
func (c *conn) do(bctx, ctx context.Context, timeout time.Duration, cmd string, args []interface{}) (interface{}, error) {
	if c.closed {
		return nil, errConnClosed
	}
	if c.inPipeline() || cmd == "" {
		// Do while a pipeline is in flight reads its replies, as redigo's
		// Do does: stay on the pipeline's node.
		if c.cur == nil {
			return nil, nil
		}
		c.pending, c.queued = 0, nil
		v, err := rawDo(c.cur, ctx, timeout, cmd, args)
		c.checkConn(err)
		return v, err
	}
	slot := -1
	if key, ok := commandKey(cmd, args); ok {
		slot = Slot(key)
	}
	var (
		addr    string
		asking  bool
		lastErr error
	)
	for attempt := 0; ; attempt++ {
		if attempt > c.p.cfg.maxRedirects {
			return nil, fmt.Errorf("redsem/cluster: %s: gave up after %d redirects or retries: %w", cmd, attempt-1, lastErr)
		}
		if !asking {
			if addr = c.target(slot); addr == "" {
				if err := c.p.refresh(bctx, false); err != nil {
					return nil, err
				}
				if addr = c.target(slot); addr == "" {
					// In a failover the map can lack a master for the slot
					// until the nodes agree on the new one (a refresh in
					// between): ask again after a backoff, as after a
					// redirect, rather than fail at once.
					lastErr = fmt.Errorf("%w: no master for slot %d", ErrNoNode, slot)
					c.p.stats.retries.Add(1)
					if err := backoff(bctx, attempt); err != nil {
						return nil, lastErr
					}
					continue
				}
			}
		}
		nc, err := c.use(bctx, addr)
		if err != nil {
			// Nothing was sent: a failed dial (the node is down or gone)
			// is safe to retry once the map is fresh.
			if errors.Is(err, ErrClosed) || bctx.Err() != nil {
				return nil, err
			}
			c.p.nodeFailed(addr)
			lastErr, asking = err, false
			c.p.stats.retries.Add(1)
			if err := backoff(bctx, attempt); err != nil {
				return nil, lastErr
			}
			continue
		}
		if asking {
			if err := nc.Send("ASKING"); err != nil {
				c.checkConn(err)
				return nil, err
			}
		}
		v, err := rawDo(nc, ctx, timeout, cmd, args)
		if err == nil {
			return v, nil
		}
		kind, rslot, raddr := redirect(err)
		switch kind {
		case "MOVED":
			addr, asking = c.resolve(raddr), false
			c.p.moved(rslot, addr)
		case "ASK":
			c.p.stats.ask.Add(1)
			addr, asking = c.resolve(raddr), true
		case "TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "UNBLOCKED":
			asking = false
			c.p.stats.retries.Add(1)
			if kind != "TRYAGAIN" {
				c.p.refreshAsync()
			}
			if berr := backoff(bctx, attempt); berr != nil {
				return nil, err
			}
		default:
			c.checkConn(err)
			return v, err
		}
		lastErr = err
	}
}

// checkConn reacts to a failed node connection: it is given back (the pool
// discards broken ones) and the node's idle connections are dropped.
// A cancelled context or a read timeout breaks the connection but says
// nothing about the node: only the connection goes.
func (c *conn) checkConn(err error) {
	if err == nil || c.cur == nil || c.cur.Err() == nil {
		return
	}
	var ne net.Error
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		!(errors.As(err, &ne) && ne.Timeout()) {
		c.p.nodeFailed(c.addr)
	}
	c.release()
}

// Send queues a command. The first Send of a pipeline picks the node by its
// key; the rest follow it there.
func (c *conn) Send(cmd string, args ...interface{}) error {
	if c.closed {
		return errConnClosed
	}
	if !c.inPipeline() {
		slot := -1
		if key, ok := commandKey(cmd, args); ok {
			slot = Slot(key)
		}
		addr := c.target(slot)
		if addr == "" {
			if err := c.p.refresh(context.Background(), false); err != nil {
				return err
			}
			if addr = c.target(slot); addr == "" {
				return fmt.Errorf("%w: no master for slot %d", ErrNoNode, slot)
			}
		}
		if _, err := c.use(context.Background(), addr); err != nil {
			c.p.nodeFailed(addr)
			return err
		}
	}
	if err := c.cur.Send(cmd, args...); err != nil {
		c.checkConn(err)
		return err
	}
	c.pending++
	return nil
}

func (c *conn) Flush() error {
	if c.closed {
		return errConnClosed
	}
	if c.cur == nil {
		return nil
	}
	err := c.cur.Flush()
	c.checkConn(err)
	return err
}

func (c *conn) Receive() (interface{}, error) {
	return c.receive(func(nc redis.Conn) (interface{}, error) { return nc.Receive() })
}

func (c *conn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return c.receive(func(nc redis.Conn) (interface{}, error) { return redis.ReceiveContext(nc, ctx) })
}

func (c *conn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	return c.receive(func(nc redis.Conn) (interface{}, error) { return redis.ReceiveWithTimeout(nc, timeout) })
}

func (c *conn) receive(read func(redis.Conn) (interface{}, error)) (interface{}, error) {
	if c.closed {
		return nil, errConnClosed
	}
	if len(c.queued) > 0 {
		r := c.queued[0]
		c.queued = c.queued[1:]
		return r.v, r.err
	}
	if c.cur == nil {
		return nil, errors.New("redsem/cluster: Receive without Send")
	}
	v, err := read(c.cur)
	if c.pending > 0 {
		c.pending--
	}
	if err == nil {
		return v, nil
	}
	if !isRedisError(err) {
		c.checkConn(err)
		return nil, err
	}
	rerr := c.pipelineRedirect(err)
	if rerr == nil {
		return v, err
	}
	// Read the rest of the pipeline now: its replies come back quickly
	// (they were refused too, or ran on this node), and the connection must
	// not go back to the pool with replies on the wire.
	for c.pending > 0 {
		v, err := redis.ReceiveWithTimeout(c.cur, drainTimeout)
		c.pending--
		if err != nil && !isRedisError(err) {
			c.checkConn(err)
			c.queued = append(c.queued, reply{nil, err})
			break
		}
		if e := c.pipelineRedirect(err); e != nil {
			err = e
		}
		c.queued = append(c.queued, reply{v, err})
	}
	return nil, rerr
}

// pipelineRedirect turns a redirection or transient cluster error inside a
// pipeline into a *RedirectError and updates the map; other errors give nil.
func (c *conn) pipelineRedirect(err error) error {
	kind, slot, addr := redirect(err)
	if kind == "" {
		return nil
	}
	switch kind {
	case "MOVED":
		addr = c.resolve(addr)
		c.p.moved(slot, addr)
	case "ASK":
		addr = c.resolve(addr)
		c.p.stats.ask.Add(1)
	case "TRYAGAIN":
		c.p.stats.retries.Add(1)
	default:
		c.p.stats.retries.Add(1)
		c.p.refreshAsync()
	}
	return &RedirectError{Kind: kind, Slot: slot, Addr: addr, Msg: err.Error()}
}

func isRedisError(err error) bool {
	_, ok := err.(redis.Error)
	return ok
}

// Err returns a non-nil error when the node connection is broken, or after
// Close.
func (c *conn) Err() error {
	if c.closed {
		return errConnClosed
	}
	if c.cur != nil {
		return c.cur.Err()
	}
	return nil
}

// Close gives the node connection back to its pool.
func (c *conn) Close() error {
	if c.closed {
		return nil
	}
	c.release()
	c.closed = true
	return nil
}
