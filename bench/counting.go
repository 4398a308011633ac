package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// counters counts what clients send: round trips (one write of one or more
// commands whose replies the client then waits for) and commands. They are
// shared by every connection of one library in one run; a child (of one
// worker) counts into its parent too, so that the round trips of one call
// can be told apart from those of the other workers.
type counters struct {
	roundTrips atomic.Int64
	commands   atomic.Int64
	parent     *counters

	mu     sync.Mutex
	byName map[string]int64 // commands sent, by lower-case name
}

// child returns counters that count into c as well.
func (c *counters) child() *counters { return &counters{parent: c} }

// trip counts one round trip.
func (c *counters) trip() {
	for ; c != nil; c = c.parent {
		c.roundTrips.Add(1)
	}
}

// sent counts one command the client sent.
func (c *counters) sent(name string) {
	name = strings.ToLower(name)
	for ; c != nil; c = c.parent {
		c.commands.Add(1)
		c.mu.Lock()
		if c.byName == nil {
			c.byName = map[string]int64{}
		}
		c.byName[name]++
		c.mu.Unlock()
	}
}

// sentByName returns a copy of the commands sent so far, by name.
func (c *counters) sentByName() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int64, len(c.byName))
	for k, v := range c.byName {
		m[k] = v
	}
	return m
}

func (c *counters) snapshot() (rt, cmds int64) {
	return c.roundTrips.Load(), c.commands.Load()
}

// countingPool wraps a redigo pool so that every connection it hands out
// counts its round trips and commands. It satisfies redsem.Pool and
// redsync's redigo Pool interface.
type countingPool struct {
	pool *redis.Pool
	c    *counters
}

func (p *countingPool) Get() redis.Conn {
	return &countingConn{conn: p.pool.Get(), c: p.c}
}

func (p *countingPool) GetContext(ctx context.Context) (redis.Conn, error) {
	conn, err := p.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn: conn, c: p.c}, nil
}

func (p *countingPool) Close() error { return p.pool.Close() }

// countingConn counts on a redigo connection. Commands written with Send are
// pending until Flush or the next Do writes them: that write is one round
// trip, however many commands it carries. It implements
// redis.ConnWithContext and redis.ConnWithTimeout, which redsem needs.
type countingConn struct {
	conn    redis.Conn
	c       *counters
	pending int
}

var (
	_ redis.ConnWithContext = (*countingConn)(nil)
	_ redis.ConnWithTimeout = (*countingConn)(nil)
)

func (c *countingConn) Close() error { return c.conn.Close() }
func (c *countingConn) Err() error   { return c.conn.Err() }

func (c *countingConn) count(cmd string) {
	if cmd != "" {
		c.c.sent(cmd)
	}
	if cmd != "" || c.pending > 0 {
		c.c.trip()
	}
	c.pending = 0
}

func (c *countingConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	c.count(cmd)
	return c.conn.Do(cmd, args...)
}

func (c *countingConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	c.count(cmd)
	return redis.DoContext(c.conn, ctx, cmd, args...)
}

func (c *countingConn) DoWithTimeout(d time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	c.count(cmd)
	return redis.DoWithTimeout(c.conn, d, cmd, args...)
}

func (c *countingConn) Send(cmd string, args ...interface{}) error {
	c.c.sent(cmd)
	c.pending++
	return c.conn.Send(cmd, args...)
}

func (c *countingConn) Flush() error {
	if c.pending > 0 {
		c.c.trip()
		c.pending = 0
	}
	return c.conn.Flush()
}

func (c *countingConn) Receive() (interface{}, error) { return c.conn.Receive() }

func (c *countingConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return redis.ReceiveContext(c.conn, ctx)
}

func (c *countingConn) ReceiveWithTimeout(d time.Duration) (interface{}, error) {
	return redis.ReceiveWithTimeout(c.conn, d)
}

// countingHook counts round trips and commands of a go-redis client: one
// round trip per Process and per pipeline.
type countingHook struct{ c *counters }

func (h countingHook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (h countingHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.c.trip()
		h.c.sent(cmd.Name())
		return next(ctx, cmd)
	}
}

func (h countingHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.c.trip()
		for _, cmd := range cmds {
			h.c.sent(cmd.Name())
		}
		return next(ctx, cmds)
	}
}

// countingRueidis counts round trips and commands of a rueidis client: one
// round trip per Do (rueidis may write concurrent Dos of several goroutines
// at once; the bench's lock calls are one goroutine's) and per DoMulti.
type countingRueidis struct {
	rueidis.Client
	c *counters
}

func (r countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r.c.trip()
	r.c.sent(cmd.Commands()[0])
	return r.Client.Do(ctx, cmd)
}

func (r countingRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	r.c.trip()
	for _, cmd := range cmds {
		r.c.sent(cmd.Commands()[0])
	}
	return r.Client.DoMulti(ctx, cmds...)
}
