package goredis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"

	"github.com/redsem/redsem/cluster"
)

// conn is a redigo connection over a go-redis client. It keeps no go-redis
// connection between commands: each command (Do) or pipeline (the Sends
// before a Flush) is a batch, which borrows one connection of the node that
// serves its first key, runs there in one write, and gives the connection
// back once every reply is read.
//
// Each batch runs in a goroutine of its own (a lone command without a
// context that can end runs on the caller's) and the caller waits for it,
// its context or its timeout, whichever comes first. When the caller stops
// waiting, the conn is broken (Err reports why), and the batch is
// abandoned: a blocking command in it is unblocked (CLIENT UNBLOCK), so the
// borrowed connection reads its last reply and goes back to go-redis's pool
// clean; a connection that fails instead is discarded by go-redis.
type conn struct {
	p       *Pool
	pending []command // sent, not flushed
	batches []*batch  // flushed, with replies left to read, oldest first
	err     error     // set once the conn is broken or closed
}

type command struct {
	name string
	args []interface{}
}

type reply struct {
	v   interface{}
	err error
}

// batch is commands flushed together.
type batch struct {
	cmds     []command
	follow   bool          // a lone command: follow cluster redirections
	block    time.Duration // the sum of the blocking commands' timeouts
	blocking bool          // holds a blocking command
	prev     *batch        // runs after prev
	done     chan struct{} // closed once replies is set
	replies  []reply
	read     int

	abandoned atomic.Bool
	// Of a blocking batch: the node and the CLIENT ID of the connection it
	// blocks on, 0 before and after that. mu is held across an unblock, so
	// the connection cannot go back to the pool (and serve someone else's
	// blocking command) while CLIENT UNBLOCK for it is under way.
	mu   sync.Mutex
	node *redis.Client
	id   int64
}

var (
	errClosed    = errors.New("redsem/goredis: connection closed")
	errAbandoned = errors.New("redsem/goredis: batch abandoned before it was sent")
	errNoSend    = errors.New("redsem/goredis: Receive without Send")
)

func (c *conn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return c.do(context.Background(), cmd, args)
}

func (c *conn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return c.do(ctx, cmd, args)
}

func (c *conn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	if timeout <= 0 {
		return c.do(context.Background(), cmd, args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.do(ctx, cmd, args)
}

// do runs cmd after the commands already sent and reads every outstanding
// reply, as redigo's Do does: it returns cmd's reply and the first error
// reply among them. cmd "" only flushes and returns the outstanding replies.
func (c *conn) do(ctx context.Context, cmd string, args []interface{}) (interface{}, error) {
	if c.err != nil {
		return nil, c.err
	}
	lone := len(c.pending) == 0 && len(c.batches) == 0
	if cmd == "" && lone {
		return []interface{}{}, nil
	}
	if cmd != "" {
		c.pending = append(c.pending, command{cmd, args})
	}
	// A lone command whose context cannot end runs on this goroutine.
	c.flush(lone, lone && ctx.Done() == nil)
	var (
		all      []interface{}
		last     interface{}
		firstErr error
	)
	for len(c.batches) > 0 {
		v, err := c.receive(ctx)
		if err != nil && !isRedigoError(err) {
			return nil, err
		}
		if err != nil {
			v = err
			if firstErr == nil {
				firstErr = err
			}
		}
		all = append(all, v)
		last = v
	}
	if cmd == "" {
		return all, nil
	}
	if _, ok := last.(redigo.Error); ok {
		last = nil
	}
	return last, firstErr
}

// Send queues a command; Flush sends it.
func (c *conn) Send(cmd string, args ...interface{}) error {
	if c.err != nil {
		return c.err
	}
	c.pending = append(c.pending, command{cmd, args})
	return nil
}

// Flush starts the queued commands, as one batch, and returns at once; their
// replies are read by Receive.
func (c *conn) Flush() error {
	if c.err != nil {
		return c.err
	}
	c.flush(false, false)
	return nil
}

// flush makes the pending commands a batch and starts it, on this goroutine
// (inline) or its own.
func (c *conn) flush(follow, inline bool) {
	if len(c.pending) == 0 {
		return
	}
	b := &batch{cmds: c.pending, follow: follow, done: make(chan struct{})}
	b.block, b.blocking = blockTime(b.cmds)
	c.pending = nil
	if n := len(c.batches); n > 0 {
		b.prev = c.batches[n-1]
	}
	c.batches = append(c.batches, b)
	if inline {
		c.p.run(b)
		return
	}
	go c.p.run(b)
}

func (c *conn) Receive() (interface{}, error) { return c.receive(context.Background()) }

func (c *conn) ReceiveContext(ctx context.Context) (interface{}, error) { return c.receive(ctx) }

func (c *conn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	if timeout <= 0 {
		return c.receive(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.receive(ctx)
}

// receive returns the next reply, waiting for its batch until ctx ends. Commands sent but not flushed are flushed first.
func (c *conn) receive(ctx context.Context) (interface{}, error) {
	if c.err != nil {
		return nil, c.err
	}
	if len(c.batches) == 0 {
		c.flush(false, false)
	}
	if len(c.batches) == 0 {
		return nil, errNoSend
	}
	b := c.batches[0]
	if ctx.Done() != nil {
		// A context already ended fails the read even if its reply is in,
		// as on redigo: the caller has given up and settles by id.
		if err := ctx.Err(); err != nil {
			c.fail(err)
			return nil, err
		}
		select {
		case <-b.done:
		case <-ctx.Done():
			err := ctx.Err()
			c.fail(err)
			return nil, err
		}
	} else {
		<-b.done
	}
	r := b.replies[b.read]
	if b.read++; b.read == len(b.replies) {
		c.batches = c.batches[1:]
	}
	if r.err != nil && !isRedigoError(r.err) {
		c.fail(r.err)
	}
	return r.v, r.err
}

// fail breaks the conn with err and abandons what is still in flight.
func (c *conn) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	for _, b := range c.batches {
		c.p.abandon(b)
	}
	c.batches, c.pending = nil, nil
}

// Err returns a non-nil error once the conn is broken or closed.
func (c *conn) Err() error { return c.err }

// Close gives up the conn. Batches still in flight are abandoned (see conn).
func (c *conn) Close() error {
	c.fail(errClosed)
	return nil
}

// run runs b after the batch before it and sets its replies.
func (p *Pool) run(b *batch) {
	defer close(b.done)
	if b.prev != nil {
		<-b.prev.done
	}
	b.replies = p.exec(context.Background(), b)
}

// maxRedirects bounds how often a lone command follows a cluster redirection
// or waits out a transient cluster state.
const maxRedirects = 8

// exec runs b on the node of its first key. A lone command follows MOVED and
// ASK and retries TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN, READONLY and
// UNBLOCKED (Redis refused it before running it, or ended its wait); in a
// pipeline these come back as *cluster.RedirectError.
func (p *Pool) exec(ctx context.Context, b *batch) []reply {
	key := ""
	for _, c := range b.cmds {
		if k, ok := commandKey(c.name, c.args); ok {
			key = k
			break
		}
	}
	var (
		addr   string
		asking bool
	)
	for attempt := 0; ; attempt++ {
		var (
			node *redis.Client
			err  error
		)
		if addr != "" {
			node, err = p.nodeAt(ctx, addr)
			if err != nil && attempt < maxRedirects {
				// A node the client's slot map does not know yet:
				// reload it and route by key again.
				p.reload(ctx)
				addr, asking = "", false
				time.Sleep(10 * time.Millisecond << min(attempt, 5))
				continue
			}
		} else {
			node, err = p.node(ctx, key)
		}
		if err != nil {
			return failAll(b, err)
		}
		replies := p.execOn(ctx, node, b, asking)
		if p.cluster == nil {
			// What go-redis's own retries covered (see onceClient): a
			// server loading its data, a master down or turned replica
			// refuse a command before running it.
			switch kind, _, _ := redirect(replies[0].err); kind {
			case "LOADING", "MASTERDOWN", "READONLY":
				if b.follow && attempt < maxRedirects {
					time.Sleep(10 * time.Millisecond << min(attempt, 5))
					continue
				}
			}
			return replies
		}
		if !b.follow || attempt >= maxRedirects {
			return p.redirected(ctx, replies)
		}
		kind, _, raddr := redirect(replies[0].err)
		switch kind {
		case "MOVED":
			p.reload(ctx)
			addr, asking = raddr, false
		case "ASK":
			addr, asking = raddr, true
		case "TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "UNBLOCKED":
			p.reload(ctx)
			addr, asking = "", false
			time.Sleep(10 * time.Millisecond << min(attempt, 5))
		default:
			return replies
		}
	}
}

// execOn runs b on one connection of node, in one write.
func (p *Pool) execOn(ctx context.Context, node *redis.Client, b *batch, asking bool) []reply {
	client := p.quiet(node)
	if b.blocking {
		// go-redis reads a pipeline under the client's ReadTimeout; give a
		// blocking one its block time on top.
		if rt := node.Options().ReadTimeout; rt > 0 {
			t := rt + b.block
			if b.block == 0 {
				t = -1 // blocks for ever: no deadline
			}
			client = onceClient(node, t)
		}
	}
	pin := client.Conn()
	defer pin.Close()
	if b.blocking {
		id, err := pin.ClientID(ctx).Result()
		if err != nil {
			return failAll(b, replyErr(err))
		}
		b.mu.Lock()
		b.node, b.id = node, id
		abandoned := b.abandoned.Load()
		b.mu.Unlock()
		defer func() {
			// Before the deferred Close gives the connection back.
			b.mu.Lock()
			b.id = 0
			b.mu.Unlock()
		}()
		if abandoned {
			return failAll(b, errAbandoned)
		}
	}
	if len(b.cmds) == 1 && !asking {
		cmd := pin.Do(ctx, b.cmds[0].argv()...)
		return []reply{toReply(cmd.Val(), cmd.Err())}
	}
	cmds, _ := pin.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		if asking {
			pipe.Do(ctx, "asking")
		}
		for _, c := range b.cmds {
			pipe.Do(ctx, c.argv()...)
		}
		return nil
	})
	if asking && len(cmds) > 0 {
		cmds = cmds[1:]
	}
	out := make([]reply, len(b.cmds))
	for i := range out {
		if i >= len(cmds) {
			out[i] = reply{err: errors.New("redsem/goredis: reply missing")}
			continue
		}
		cmd := cmds[i].(*redis.Cmd)
		out[i] = toReply(cmd.Val(), cmd.Err())
	}
	return out
}

// argv is the command as go-redis takes it.
func (c command) argv() []interface{} {
	argv := make([]interface{}, 0, 1+len(c.args))
	argv = append(argv, c.name)
	for _, a := range c.args {
		argv = append(argv, toArg(a))
	}
	return argv
}

func failAll(b *batch, err error) []reply {
	out := make([]reply, len(b.cmds))
	for i := range out {
		out[i] = reply{err: err}
	}
	return out
}

// redirected turns the cluster redirections among a pipeline's replies into
// *cluster.RedirectError, which is not a redis.Error: the caller must treat
// the pipeline as broken and settle it.
func (p *Pool) redirected(ctx context.Context, replies []reply) []reply {
	for i, r := range replies {
		kind, slot, addr := redirect(r.err)
		if kind == "" {
			continue
		}
		p.reload(ctx)
		replies[i].err = &cluster.RedirectError{Kind: kind, Slot: slot, Addr: addr, Msg: r.err.Error()}
	}
	return replies
}

// redirect returns the kind of a cluster redirection or transient cluster
// state ("MOVED", "ASK", "TRYAGAIN", ...) and, for MOVED and ASK, the slot
// and the node (else -1 and "").
func redirect(err error) (kind string, slot int, addr string) {
	var re redigo.Error
	if !errors.As(err, &re) {
		return "", -1, ""
	}
	f := strings.Fields(string(re))
	if len(f) == 0 {
		return "", -1, ""
	}
	switch f[0] {
	case "MOVED", "ASK":
		if len(f) == 3 {
			if n, err := strconv.Atoi(f[1]); err == nil {
				return f[0], n, f[2]
			}
		}
	case "TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "UNBLOCKED":
		return f[0], -1, ""
	}
	return "", -1, ""
}

// abandon gives up on b: if it has not been sent, it never is; if it blocks
// in Redis, it is unblocked (CLIENT UNBLOCK, as if its timeout had passed),
// retrying until it is, it ends, or unblockFor passes.
func (p *Pool) abandon(b *batch) {
	if !b.abandoned.CompareAndSwap(false, true) || !b.blocking {
		return
	}
	go func() {
		deadline := time.Now().Add(unblockFor)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(deadline) {
			if b.unblock() {
				return
			}
			select {
			case <-b.done:
				return
			case <-tick.C:
			}
		}
	}()
}

// unblock sends CLIENT UNBLOCK for b's connection, if b blocks on one now.
// It reports whether to stop trying: the command was unblocked, or Redis
// refused (NOPERM: it then ends at its own timeout).
func (b *batch) unblock() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.id == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, err := b.node.ClientUnblock(ctx, b.id).Result()
	var re redis.Error
	return n == 1 || (err != nil && errors.As(err, &re))
}
