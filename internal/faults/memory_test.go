package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// Fault 8a: with an evicting policy (allkeys-lru) Redis silently deletes the
// semaphore's keys under memory pressure. CheckServer refuses such a server;
// the test also shows what eviction does to a semaphore that ignores that.
func TestEvictingServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	pool := srv.Pool(t)
	ctx := ctxT(t, 30*time.Second)
	err := admin.CheckServer(ctx, pool)
	assert.ErrorIs(t, err, admin.ErrEvictingServer)
	t.Logf("CheckServer on allkeys-lru: %v", err)

	sem, err := redsem.NewSemaphore(pool, "evict", 2, redsem.WithTTL(10*time.Second), redsem.WithFixedTTL())
	require.NoError(t, err)
	l, err := sem.Acquire(ctx)
	require.NoError(t, err)
	k := history.KeysFor("redsem:", "evict")
	c := pool.Get()
	defer c.Close()
	used, err := redis.String(c.Do("INFO", "memory"))
	require.NoError(t, err)
	var usedBytes int64
	for _, line := range strings.Split(used, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			fmt.Sscan(v, &usedBytes)
		}
	}
	_, err = c.Do("CONFIG", "SET", "maxmemory", usedBytes+256<<10)
	require.NoError(t, err)
	junk := strings.Repeat("j", 1024)
	evicted := false
	for i := 0; i < 20000 && !evicted; i++ {
		_, _ = c.Do("SET", fmt.Sprintf("junk:%d", i), junk)
		if i%100 == 0 {
			n, _ := redis.Int(c.Do("EXISTS", k.Meta, k.Tokens, k.Leases, k.Holders))
			evicted = n < 4
		}
	}
	_, err = c.Do("CONFIG", "SET", "maxmemory", 0)
	require.NoError(t, err)
	require.True(t, evicted, "no semaphore key was evicted")
	n, _ := redis.Int(c.Do("EXISTS", k.Meta, k.Tokens, k.Leases, k.Holders))
	relErr := l.Release(ctx)
	_, acqErr := sem.TryAcquire(ctx)
	t.Logf("allkeys-lru evicted %d of the 4 semaphore keys while a lease was held: Release -> %v; next TryAcquire -> %v (what CheckServer exists to prevent)",
		4-n, relErr, acqErr)
}

// fakeOldRedis answers every command with an INFO text of Redis 6.0.16.
func fakeOldRedis(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				rd := bufio.NewReader(conn)
				for {
					// read one RESP array command
					line, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					var n int
					fmt.Sscanf(line, "*%d", &n)
					for i := 0; i < 2*n; i++ {
						if _, err := rd.ReadString('\n'); err != nil {
							return
						}
					}
					body := "# Server\r\nredis_version:6.0.16\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n"
					fmt.Fprintf(conn, "$%d\r\n%s\r\n", len(body), body)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// CheckServer's version check against a server that says it is 6.0.
func TestCheckServerTooOld(t *testing.T) {
	t.Parallel()
	addr := fakeOldRedis(t)
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) { return redis.DialContext(ctx, "tcp", addr) }}
	defer pool.Close()
	err := admin.CheckServer(ctxT(t, 5*time.Second), pool)
	assert.ErrorIs(t, err, admin.ErrServerTooOld)
	t.Logf("CheckServer on a 6.0.16: %v", err)
}

// Fault 8b: noeviction at maxmemory: Release still works (its first write
// frees memory), and so must Refresh; the test records what Acquire and creation do.
func TestOOMNoEviction(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	pool := srv.Pool(t)
	ctx := ctxT(t, 30*time.Second)
	require.NoError(t, admin.CheckServer(ctx, pool))
	sem, err := redsem.NewSemaphore(pool, "oom", 3, redsem.WithTTL(10*time.Second), redsem.WithFixedTTL())
	require.NoError(t, err)
	a, err := sem.Acquire(ctx)
	require.NoError(t, err)
	b, err := sem.Acquire(ctx)
	require.NoError(t, err)
	srv.Do(t, "CONFIG", "SET", "maxmemory", 1) // every write that may grow memory now gets -OOM
	_, err = redis.String(srv.Do(t, "PING"), nil)
	require.NoError(t, err)
	c, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Do("SET", "probe", "x")
	require.Error(t, err, "the server is not at OOM")
	require.Contains(t, err.Error(), "OOM")

	// Release must work at OOM.
	assert.NoError(t, a.Release(ctx), "Release at OOM")
	// Refresh must work at OOM too: its first write (ZREM) frees memory.
	refErr := b.Refresh(ctx, 10*time.Second)
	assert.NoError(t, refErr, "Refresh at OOM")
	// Fast path with a token free.
	fast, fastErr := sem.TryAcquire(ctx)
	// Fast path again (one token left), then the blocking path with none free.
	fast2, fast2Err := sem.TryAcquire(ctx)
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, blockErr := sem.Acquire(bctx)
	cancel()
	blockTook := time.Since(start)
	// Creating a new semaphore.
	other, err := redsem.NewSemaphore(pool, "oom-new", 1)
	require.NoError(t, err)
	_, createErr := other.TryAcquire(ctx)
	n, _ := redis.Int(c.Do("EXISTS", history.KeysFor("redsem:", "oom-new").Meta))
	assert.Zero(t, n, "creation at OOM left a partial semaphore")

	t.Logf("at OOM (noeviction): Release ok; Refresh -> %v; TryAcquire with a free token -> lease=%v err=%v; again -> lease=%v err=%v; blocking Acquire with none free -> %v after %v; creating a new semaphore -> %v",
		refErr, fast != nil, fastErr, fast2 != nil, fast2Err, blockErr, blockTook.Round(time.Millisecond), createErr)
	// New acquisitions fail clearly at OOM: the fast path's first write is
	// the fence HSET, which Redis refuses; nothing is taken.
	assert.Error(t, fastErr, "TryAcquire at OOM")
	assert.Nil(t, fast)
	assert.ErrorIs(t, fastErr, redsem.ErrOutOfMemory)
	assert.Error(t, fast2Err, "TryAcquire at OOM, again")
	assert.ErrorIs(t, blockErr, redsem.ErrOutOfMemory, "a blocking Acquire at OOM should fail")
	if blockErr != nil {
		assert.False(t, errors.Is(blockErr, context.DeadlineExceeded) && blockTook > 2*time.Second,
			"a blocking Acquire at OOM waited out its context instead of failing clearly: %v", blockErr)
	}
	assert.Error(t, createErr, "creating a semaphore at OOM should fail")

	// Back to normal: every held lease releases and all tokens are there.
	srv.Do(t, "CONFIG", "SET", "maxmemory", 0)
	for _, l := range []*redsem.Lease{b, fast, fast2} {
		if l != nil {
			assert.NoError(t, l.Release(ctx))
		}
	}
	quiesce(t, opsFor(t, pool, "oom"), sem, 12*time.Second)
}

// opsFor is an admin.Handle for name under the default prefix, on pool.
func opsFor(t *testing.T, pool redsem.Pool, name string) *admin.Handle {
	t.Helper()
	h, err := admin.New(pool, redsem.DefaultPrefix, name)
	require.NoError(t, err)
	return h
}
