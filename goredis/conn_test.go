package goredis_test

import (
	"context"
	"testing"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/behaviour"
	"github.com/redsem/redsem/internal/redistest"
)

func TestNewRefusesOtherClients(t *testing.T) {
	_, err := goredis.New(nil)
	require.ErrorIs(t, err, goredis.ErrUnsupportedClient)
	var c *redis.Client
	_, err = goredis.New(c)
	require.ErrorIs(t, err, goredis.ErrUnsupportedClient)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	_, err = goredis.New(ring)
	require.ErrorIs(t, err, goredis.ErrUnsupportedClient)
}

func do(t *testing.T, c redigo.Conn, cmd string, args ...interface{}) interface{} {
	t.Helper()
	v, err := c.Do(cmd, args...)
	require.NoError(t, err, "%s %v", cmd, args)
	return v
}

// TestReplyShapes: whatever protocol the client speaks, replies have the
// shapes redigo gives over RESP2.
func TestReplyShapes(t *testing.T) {
	for _, proto := range []int{2, 3} {
		t.Run(map[int]string{2: "RESP2", 3: "RESP3"}[proto], func(t *testing.T) {
			rc, _ := newClient(t, proto)
			c := newPool(t, rc).Get()
			defer c.Close()
			assert.Nil(t, do(t, c, "GET", "missing"))
			assert.Equal(t, int64(3), do(t, c, "RPUSH", "l", "a", "b", "c"))
			assert.Equal(t, []interface{}{[]byte("a"), []byte("b")}, do(t, c, "LRANGE", "l", 0, 1))
			do(t, c, "HSET", "h", "x", "1", "y", "2")
			assert.Equal(t, []interface{}{[]byte("x"), []byte("1"), []byte("y"), []byte("2")}, do(t, c, "HGETALL", "h"))
			assert.Equal(t, int64(1), do(t, c, "EVAL", "return true", 0))
			assert.Nil(t, do(t, c, "EVAL", "return false", 0))
			assert.Equal(t, []interface{}{int64(1), []byte("a"), nil}, do(t, c, "EVAL", "return {1, 'a', false}", 0))
			s, err := redigo.String(c.Do("SET", "k", "v"))
			require.NoError(t, err)
			assert.Equal(t, "OK", s)
			// An error reply inside an array is a redigo error value.
			v := do(t, c, "EVAL", "return {1, redis.error_reply('REDSEM_X nope')}", 0)
			assert.Equal(t, []interface{}{int64(1), redigo.Error("REDSEM_X nope")}, v)
		})
	}
}

// TestErrorReplies: error replies are redigo's redis.Error, so redsem's
// mapping (and redigo's EVAL fallback on NOSCRIPT) works unchanged.
func TestErrorReplies(t *testing.T) {
	rc, _ := newClient(t, 0)
	c := newPool(t, rc).Get()
	defer c.Close()
	do(t, c, "SET", "k", "v")
	_, err := c.Do("LPUSH", "k", "x")
	require.IsType(t, redigo.Error(""), err)
	assert.Contains(t, err.Error(), "WRONGTYPE")
	_, err = c.Do("EVALSHA", "0000000000000000000000000000000000000000", 0)
	require.IsType(t, redigo.Error(""), err)
	assert.Contains(t, err.Error(), "NOSCRIPT")
	_, err = c.Do("EVAL", "return redis.error_reply('REDSEM_SIZE 3')", 0)
	assert.Equal(t, redigo.Error("REDSEM_SIZE 3"), err)
	assert.NoError(t, c.Err(), "an error reply leaves the connection usable")
	script := redigo.NewScript(1, "return redis.call('GET', KEYS[1])")
	do(t, c, "SCRIPT", "FLUSH")
	v, err := redigo.String(script.DoContext(context.Background(), c, "k"))
	require.NoError(t, err)
	assert.Equal(t, "v", v, "EVALSHA fell back to EVAL")
}

// TestPipeline: Send, Flush and Receive, and Do behind Sends, behave as
// redigo's.
func TestPipeline(t *testing.T) {
	rc, _ := newClient(t, 0)
	c := newPool(t, rc).Get()
	defer c.Close()
	_, err := c.Receive()
	require.Error(t, err, "Receive without Send")
	require.NoError(t, c.Send("SET", "a", "1"))
	require.NoError(t, c.Send("INCR", "a"))
	require.NoError(t, c.Send("LPUSH", "a", "x"))
	require.NoError(t, c.Flush())
	v, err := c.Receive()
	require.NoError(t, err)
	assert.Equal(t, []byte("OK"), v)
	v, err = c.Receive()
	require.NoError(t, err)
	assert.Equal(t, int64(2), v)
	_, err = c.Receive()
	assert.IsType(t, redigo.Error(""), err)
	require.NoError(t, c.Send("INCR", "a"))
	require.NoError(t, c.Send("LPUSH", "a", "x"))
	v, err = c.Do("INCR", "a")
	assert.Equal(t, int64(4), v, "Do returns its own reply")
	assert.IsType(t, redigo.Error(""), err, "and the first error reply before it")
	require.NoError(t, c.Send("GET", "a"))
	all, err := c.Do("")
	require.NoError(t, err)
	assert.Equal(t, []interface{}{[]byte("4")}, all)
}

// TestCancelBlockedRead: a read blocked in Redis returns as soon as its
// context is cancelled; the server-side wait is ended, so the go-redis
// connection goes back to its pool clean rather than blocking on.
func TestCancelBlockedRead(t *testing.T) {
	rc, s := newClient(t, 0)
	p := newPool(t, rc)
	c, err := p.GetContext(context.Background())
	require.NoError(t, err)
	require.NoError(t, c.Send("BLPOP", "never", 60))
	require.NoError(t, c.Flush())
	ctx, cancel := context.WithCancel(context.Background())
	waitBlocked(t, s, 1)
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err = redigo.ReceiveContext(c, ctx)
	took := time.Since(start)
	require.ErrorIs(t, err, context.Canceled)
	// At the cancel, not at the BLPOP's own timeout (a minute).
	t.Logf("returned %v after the read started (cancel at 50ms)", took)
	assert.Less(t, took, 30*time.Second, "the read waited for the BLPOP's timeout")
	require.Error(t, c.Err(), "the connection is broken after a cancelled read")
	require.NoError(t, c.Close())
	waitBlocked(t, s, 0)
	behaviour.WaitFor(t, 5*time.Second, "connection back in the pool", func() bool {
		st := rc.PoolStats()
		return st.TotalConns > 0 && st.IdleConns == st.TotalConns
	})
	// The pooled connection is clean: the next command reads its own reply.
	c2 := p.Get()
	defer c2.Close()
	assert.Equal(t, int64(1), do(t, c2, "RPUSH", "never", "x"))
	assert.Equal(t, []byte("x"), do(t, c2, "LPOP", "never"))
}

// TestDeadlineBlockedRead: a blocking command under a context deadline
// returns at the deadline, not at the command's own timeout or the
// client's read timeout.
func TestDeadlineBlockedRead(t *testing.T) {
	rc, s := newClient(t, 0)
	c := newPool(t, rc).Get()
	defer c.Close()
	const d = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err := redigo.DoContext(c, ctx, "BLPOP", "never", 60)
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	t.Logf("returned %v after the read started (deadline %v)", took, d)
	assert.Less(t, took, 30*time.Second, "the read waited for the BLPOP's timeout")
	waitBlocked(t, s, 0)
}

func waitBlocked(t *testing.T, s *redistest.Server, n int) {
	t.Helper()
	behaviour.WaitFor(t, 5*time.Second, "blocked clients", func() bool {
		info, err := redigo.String(s.Do(t, "INFO", "clients"), nil)
		return err == nil && behaviour.BlockedClients(info) == n
	})
}

// TestLongBlockInPipeline: a blocking command in a pipeline may block longer
// than the client's ReadTimeout (go-redis reads a pipeline under
// ReadTimeout alone).
func TestLongBlockInPipeline(t *testing.T) {
	s := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: 500 * time.Millisecond, MaintNotificationsConfig: noMaint()})
	t.Cleanup(func() { rc.Close() })
	c := newPool(t, rc).Get()
	defer c.Close()
	require.NoError(t, c.Send("BLPOP", "later", 5))
	require.NoError(t, c.Send("PING"))
	require.NoError(t, c.Flush())
	pushed := make(chan error, 1)
	time.AfterFunc(time.Second, func() {
		pc, err := redigo.Dial("tcp", s.Addr)
		if err == nil {
			_, err = pc.Do("RPUSH", "later", "x")
			pc.Close()
		}
		pushed <- err
	})
	v, err := c.Receive()
	require.NoError(t, <-pushed)
	require.NoError(t, err)
	assert.Equal(t, []interface{}{[]byte("later"), []byte("x")}, v)
	v, err = c.Receive()
	require.NoError(t, err)
	assert.Equal(t, []byte("PONG"), v)
}
