package goredis_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// aclRule is the ACL SETUSER line for user with password secret, allowed
// commands on ~redsem:* and no channel.
func aclRule(user string, commands []string) []interface{} {
	rule := []interface{}{"SETUSER", user, "on", ">secret", "resetkeys", "~redsem:*", "resetchannels", "-@all"}
	for _, c := range commands {
		rule = append(rule, "+"+c)
	}
	return rule
}

// aclRefusals returns the commands ACL LOG recorded as refused.
func aclRefusals(t *testing.T, s *redistest.Server) []string {
	entries, _ := s.Do(t, "ACL", "LOG").([]interface{})
	var refused []string
	for _, e := range entries {
		f, _ := e.([]interface{})
		for i := 0; i+1 < len(f); i += 2 {
			if k, _ := f[i].([]byte); string(k) == "object" {
				v, _ := f[i+1].([]byte)
				refused = append(refused, string(v))
			}
		}
	}
	return refused
}

// contend runs, on pool, what production does under contention: a blocked
// Acquire handed the slot by a Release, Refresh on both sides, a blocked
// AcquireN, a blocked RWMutex writer, and a rate gate's contended Wait.
func contend(t *testing.T, pool redsem.Pool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sem, err := redsem.NewSemaphore(pool, "acl-contended", 1)
	if err != nil {
		return err
	}
	held, err := sem.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("uncontended Acquire: %w", err)
	}
	type got struct {
		l   *redsem.Lease
		err error
	}
	waiter := make(chan got, 1)
	go func() {
		l, err := sem.Acquire(ctx)
		waiter <- got{l, err}
	}()
	time.Sleep(100 * time.Millisecond) // let it block
	if err := held.Refresh(ctx, 10*time.Second); err != nil {
		return fmt.Errorf("Refresh while a waiter blocks: %w", err)
	}
	if err := held.Release(ctx); err != nil {
		return fmt.Errorf("Release to a waiter: %w", err)
	}
	w := <-waiter
	if w.err != nil {
		return fmt.Errorf("blocked Acquire: %w", w.err)
	}
	if err := w.l.Refresh(ctx, 10*time.Second); err != nil {
		return fmt.Errorf("Refresh after a handoff: %w", err)
	}
	nwait := make(chan got, 1)
	go func() {
		l, err := sem.AcquireN(ctx, 1)
		nwait <- got{l, err}
	}()
	time.Sleep(100 * time.Millisecond)
	if err := w.l.Release(ctx); err != nil {
		return fmt.Errorf("Release after a handoff: %w", err)
	}
	n := <-nwait
	if n.err != nil {
		return fmt.Errorf("blocked AcquireN: %w", n.err)
	}
	if err := n.l.Release(ctx); err != nil {
		return fmt.Errorf("Release of AcquireN's lease: %w", err)
	}

	rw, err := redsem.NewRWMutex(pool, "acl-contended-rw")
	if err != nil {
		return err
	}
	r, err := rw.RLock(ctx)
	if err != nil {
		return fmt.Errorf("RLock: %w", err)
	}
	writer := make(chan got, 1)
	go func() {
		l, err := rw.Lock(ctx)
		writer <- got{l, err}
	}()
	time.Sleep(100 * time.Millisecond)
	if err := r.Release(ctx); err != nil {
		return fmt.Errorf("RUnlock: %w", err)
	}
	wr := <-writer
	if wr.err != nil {
		return fmt.Errorf("blocked Lock: %w", wr.err)
	}
	if err := wr.l.Release(ctx); err != nil {
		return fmt.Errorf("Unlock: %w", err)
	}

	g, err := rate.New(pool, "acl-contended", 1, 300*time.Millisecond)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := g.Wait(ctx)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fmt.Errorf("contended rate Wait: %w", err)
		}
	}
	return nil
}

// TestACLUnderContention holds each client's documented command list to a
// real ACL user under contention: redigo with admin.ACLCommands, go-redis
// with goredis.ACLCommands. Nothing is refused. And go-redis with
// admin.ACLCommands alone fails at the first blocked Acquire: why the
// adapter's list is longer.
func TestACLUnderContention(t *testing.T) {
	s := redistest.Start(t)
	s.Do(t, "ACL", aclRule("redigo-app", admin.ACLCommands())...)
	s.Do(t, "ACL", aclRule("goredis-app", goredis.ACLCommands())...)
	s.Do(t, "ACL", aclRule("short-app", admin.ACLCommands())...)

	t.Run("redigo", func(t *testing.T) {
		s.Do(t, "ACL", "LOG", "RESET")
		pool := s.Pool(t, redigo.DialUsername("redigo-app"), redigo.DialPassword("secret"))
		require.NoError(t, contend(t, pool))
		assert.Empty(t, aclRefusals(t, s))
	})
	t.Run("go-redis", func(t *testing.T) {
		s.Do(t, "ACL", "LOG", "RESET")
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "goredis-app", Password: "secret", MaintNotificationsConfig: noMaint()})
		t.Cleanup(func() { rc.Close() })
		require.NoError(t, contend(t, newPool(t, rc)))
		assert.Empty(t, aclRefusals(t, s))
	})
	t.Run("go-redis with the redigo list", func(t *testing.T) {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "short-app", Password: "secret", MaintNotificationsConfig: noMaint()})
		t.Cleanup(func() { rc.Close() })
		err := contend(t, newPool(t, rc))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "client|id")
	})
}

// TestACLDocsLine: docs/acl.md gives the go-redis line that ACLCommands
// makes, as admin's example holds its redigo line.
func TestACLDocsLine(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "acl.md"))
	require.NoError(t, err)
	line := "ACL SETUSER redsem-app on >secret resetkeys ~redsem:* resetchannels -@all +" + strings.Join(goredis.ACLCommands(), " +")
	assert.Contains(t, string(doc), line+"\n")
}

// countingLogger counts go-redis's log lines.
type countingLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *countingLogger) Printf(_ context.Context, format string, v ...interface{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

// TestTryAcquireRedisDown: with nothing listening, TryAcquire fails at
// once with the dial's error, on go-redis as on redigo: one dial by
// go-redis (its DialerRetries attempts, one log line), no settling of an
// acquisition that was never sent, and no word of it in the error.
func TestTryAcquireRedisDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	logs := &countingLogger{}
	redis.SetLogger(logs)
	defer redis.SetLogger(quiet{})
	var mu sync.Mutex
	dials := 0
	var d net.Dialer
	rc := redis.NewClient(&redis.Options{Addr: addr, MaintNotificationsConfig: noMaint(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dials++
			mu.Unlock()
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { rc.Close() })

	rp := &redigo.Pool{DialContext: func(ctx context.Context) (redigo.Conn, error) {
		return redigo.DialContext(ctx, "tcp", addr, redigo.DialConnectTimeout(5*time.Second))
	}}
	t.Cleanup(func() { rp.Close() })

	for _, c := range []struct {
		name string
		pool redsem.Pool
	}{{"go-redis", newPool(t, rc)}, {"redigo", rp}} {
		sem, err := redsem.NewSemaphore(c.pool, "down", 1)
		require.NoError(t, err)
		began := time.Now()
		_, err = sem.TryAcquire(context.Background())
		took := time.Since(began)
		require.Error(t, err, c.name)
		t.Logf("%s: %v after %v", c.name, err, took)
		assert.Contains(t, err.Error(), "connection refused", c.name)
		assert.NotContains(t, err.Error(), "settl", c.name)
		assert.Equal(t, 1, strings.Count(err.Error(), "connection refused"), "%s: the failure once: %v", c.name, err)
	}
	mu.Lock()
	defer mu.Unlock()
	logs.mu.Lock()
	defer logs.mu.Unlock()
	assert.LessOrEqual(t, dials, rc.Options().DialerRetries, "go-redis dialed once (with its own DialerRetries attempts)")
	assert.LessOrEqual(t, len(logs.lines), 1, "go-redis log lines: %q", logs.lines)
}
