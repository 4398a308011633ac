package redsem

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
	"github.com/redsem/redsem/rate"
)

// aclSetUser creates user with password pw allowed exactly cmds, on the keys
// under prefix and no channel, and returns a pool that logs in as it.
func aclSetUser(t *testing.T, srv *redistest.Server, user, pw, prefix string, cmds []string) *redis.Pool {
	t.Helper()
	args := []interface{}{"SETUSER", user, "reset", "on", ">" + pw, "resetkeys", "~" + prefix + "*", "resetchannels", "-@all"}
	for _, c := range cmds {
		args = append(args, "+"+c)
	}
	srv.Do(t, "ACL", args...)
	return srv.Pool(t, redis.DialUsername(user), redis.DialPassword(pw))
}

// A Redis user allowed only ACLCommands, only on the keys under the prefix,
// runs every public operation of the package: each code path that sends a
// command of its own (the waits, the weighted doorbell, the rate gate's
// queue, a shrink, a repair) is taken at least once. The server is fresh, so
// every script's first call also goes through EVAL after NOSCRIPT; a script
// new to the process is loaded first (SCRIPT LOAD), as each of redsem's is
// on its first run. Remove a
// command from aclCommands and this test fails with NOPERM (or, for a
// command a script runs under pcall, with the error the script makes of it).
func TestAdmin_ACLCommands_userRunsEveryOperation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, prefix := range []string{DefaultPrefix, "team-a:sem:"} {
		t.Run(strings.TrimSuffix(prefix, ":"), func(t *testing.T) {
			user := "app-" + strings.ReplaceAll(prefix, ":", "-")
			pool := aclSetUser(t, srv, user, "pw", prefix, admin.ACLCommands())
			c := pool.Get()
			_, err := engine.Lua(0, "return 1").Do(c)
			c.Close()
			require.NoError(t, err, "a script's first run in a process")
			runEveryOperation(t, pool, prefix)
			// Delete removed every semaphore's keys; the rate gate's, the
			// read-write lock's and the election's stay (none has a Delete).
			keys, err := redis.Strings(srv.Do(t, "KEYS", prefix+"*"), nil)
			require.NoError(t, err)
			for _, k := range keys {
				if !strings.Contains(k, "{rw}:rw:") && !strings.Contains(k, "{el}:el:") {
					assert.Contains(t, k, "{rate}:rate:", "left behind")
				}
			}
		})
	}

	// The same user under the wrong key pattern is refused at once, with
	// NOPERM in the error and nothing written.
	other := aclSetUser(t, srv, "other-keys", "pw", "other:", admin.ACLCommands())
	sem, err := NewSemaphore(other, "denied", 1)
	require.NoError(t, err)
	_, err = sem.TryAcquire(ctxT(t, 10*time.Second))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOPERM")
	keys, err := redis.Strings(srv.Do(t, "KEYS", "*denied*"), nil)
	require.NoError(t, err)
	assert.Empty(t, keys)
}

// CheckServer needs INFO, which ACLCommands leaves out: without it,
// CheckServer reports that it could not check (ErrNotChecked); with it, it
// checks.
func TestAdmin_CheckServer_underACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	ctx := ctxT(t, 10*time.Second)
	without := aclSetUser(t, srv, "no-info", "pw", DefaultPrefix, admin.ACLCommands())
	assert.ErrorIs(t, admin.CheckServer(ctx, without), admin.ErrNotChecked, "without INFO, CheckServer cannot tell, and says so")
	with := aclSetUser(t, srv, "info", "pw", DefaultPrefix, append(admin.ACLCommands(), "info"))
	assert.ErrorIs(t, admin.CheckServer(ctx, with), admin.ErrEvictingServer, "with INFO, CheckServer sees the policy")
}

// The fleet view needs SCAN, which ACLCommands leaves out: without it,
// ScanNames's error is Redis's NOPERM and says which permission to add; with
// it, the names are found.
func TestAdmin_ScanNames_underACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := ctxT(t, 10*time.Second)
	without := aclSetUser(t, srv, "no-scan", "pw", DefaultPrefix, admin.ACLCommands())
	sem, err := NewSemaphore(without, "seen", 1)
	require.NoError(t, err)
	_, err = sem.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = admin.ScanNames(ctx, without, DefaultPrefix, admin.ScanLimits{})
	var re redis.Error
	require.ErrorAs(t, err, &re)
	assert.True(t, strings.HasPrefix(string(re), "NOPERM"), "Redis's refusal: %v", err)
	assert.Contains(t, err.Error(), "allow +scan to this user")
	with := aclSetUser(t, srv, "scan", "pw", DefaultPrefix, append(admin.ACLCommands(), "scan"))
	names, err := admin.ScanNames(ctx, with, DefaultPrefix, admin.ScanLimits{})
	require.NoError(t, err)
	assert.Equal(t, []admin.Found{{Name: "seen", Kind: admin.KindSemaphore}}, names.Found)
}

// runEveryOperation runs each public operation on pool under prefix and
// fails t on any error; it deletes every semaphore it made.
func runEveryOperation(t *testing.T, pool *redis.Pool, prefix string) {
	ctx := ctxT(t, 60*time.Second)
	p := WithPrefix(prefix)
	errs := make(chan error, 16)
	mk := func(name string, size int, opts ...Option) *Semaphore {
		t.Helper()
		s, err := NewSemaphore(pool, name, size, append([]Option{p, WithTTL(2 * time.Second), WithGrace(200 * time.Millisecond)}, opts...)...)
		require.NoError(t, err)
		return s
	}
	// blocked waits for a goroutine's Acquire to register as blocked.
	blocked := func(s *Semaphore, n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && st.Waiting >= n
		}, 10*time.Second, 10*time.Millisecond, "%d waiter(s) on %s", n, s.Name())
	}

	t.Log("Acquire uncontended, TryAcquire, TryAcquire busy, Refresh, Status")
	sem := mk("plain", 2)
	l1, err := sem.Acquire(ctx)
	require.NoError(t, err)
	l2, err := sem.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = sem.TryAcquire(ctx)
	require.ErrorIs(t, err, ErrNoToken)
	require.NoError(t, l1.Refresh(ctx, 3*time.Second))
	st, err := sem.Status(ctx)
	require.NoError(t, err)
	assert.Len(t, st.Holders, 2)

	t.Log("Acquire contended, blocked then woken: shared wait (default) and own connection")
	for _, conns := range []int{1, 0} {
		s := mk("plain", 2, WithWaitConnections(conns))
		got := acquireAsync(ctx, s.Acquire)
		blocked(s, 1)
		require.NoError(t, l2.Release(ctx))
		l, ok := <-got
		require.True(t, ok, "woken waiter (wait connections %d) got a lease", conns)
		l2 = l
	}

	t.Log("Acquire cancelled while blocked (abort)")
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = sem.Acquire(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, l1.Release(ctx))
	require.NoError(t, l2.Release(ctx))

	t.Log("Reclaim of an expired lease")
	exp := mk("plain", 2, WithTTL(100*time.Millisecond), WithFixedTTL())
	_, err = exp.Acquire(ctx)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	n, err := sem.Reclaim(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)

	t.Log("auto-refresh keeps a short lease")
	// Judged by a refresh that Redis confirmed (the local deadline moves
	// on), not by a lease that outlived a sleep: a loaded machine may let
	// a 300ms lease lapse between two refreshes.
	auto := mk("plain", 2, WithTTL(2*time.Second), WithAutoRefresh())
	la, err := auto.Acquire(ctx)
	require.NoError(t, err)
	firstDeadline := la.Deadline()
	require.Eventually(t, func() bool { return la.Deadline().After(firstDeadline) || !la.Valid() },
		20*time.Second, 10*time.Millisecond, "auto-refresh never ran")
	require.True(t, la.Valid(), "auto-refresh kept the lease: %v", la.Err())
	require.NoError(t, la.Release(ctx))

	t.Log("AcquireN under contention, a weighted waiter queued behind it, Release while it collects, a cancelled AcquireN")
	w := mk("weighted", 3)
	h1, err := w.Acquire(ctx)
	require.NoError(t, err)
	h2, err := w.Acquire(ctx)
	require.NoError(t, err)
	_, err = w.TryAcquireN(ctx, 2)
	require.ErrorIs(t, err, ErrNoToken)
	first := make(chan *Lease, 1)
	go func() {
		l, err := w.AcquireN(ctx, 3)
		if err != nil {
			errs <- fmt.Errorf("AcquireN(3): %w", err)
			close(first)
			return
		}
		first <- l
	}()
	// It collects the free token and waits for two more.
	require.Eventually(t, func() bool {
		st, err := w.Status(ctx)
		return err == nil && len(st.Holders) == 3
	}, 10*time.Second, 10*time.Millisecond, "AcquireN(3) collecting")
	second := make(chan *Lease, 1)
	go func() {
		l, err := w.AcquireN(ctx, 2)
		if err != nil {
			errs <- fmt.Errorf("AcquireN(2): %w", err)
			close(second)
			return
		}
		second <- l
	}()
	blocked(w, 2)
	// Cancelled once it waits, not on a timer a loaded machine may beat:
	// its abort must run as this user.
	cctx, ccancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := w.AcquireN(cctx, 2); gaveUp <- err }()
	blocked(w, 3)
	ccancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled, "a queued AcquireN gives up")
	require.NoError(t, h1.Release(ctx), "Release routes its token to the collecting waiter")
	require.NoError(t, h2.Release(ctx))
	l3, ok := <-first
	require.True(t, ok, "AcquireN(3) granted: %v", drain(errs))
	assert.Len(t, l3.Tokens(), 3)
	require.NoError(t, l3.Release(ctx))
	l4, ok := <-second
	require.True(t, ok, "AcquireN(2) granted: %v", drain(errs))
	require.NoError(t, l4.Refresh(ctx, 2*time.Second))
	require.NoError(t, l4.Release(ctx))
	// The cancelled AcquireN was settled in full (it settles in the
	// background, and a failing abort is swallowed: the ctx error is what
	// the caller sees): it left its tombstone, and nobody collects or waits.
	// At least one: on a loaded machine a waiter of this test may also be
	// swept and come back as a new acquisition, leaving a tombstone more.
	require.Eventually(t, func() bool { return tombstones(t, pool, w.k.waits) >= 1 },
		time.Minute, 10*time.Millisecond, "the cancelled AcquireN's tombstone")
	l5, err := w.TryAcquireN(ctx, 3)
	require.NoError(t, err, "the queue is empty again")

	t.Log("Resize down while a slot above the new size is held, Resize up, Check, Repair")
	require.NoError(t, l5.Release(ctx))
	var top *Lease // holds slot 3
	hs := holdN(t, ctx, w.Acquire, 3)
	for _, h := range hs {
		if strings.HasSuffix(h.Token(), ":3") {
			top = h
		} else {
			require.NoError(t, h.Release(ctx))
		}
	}
	require.NotNil(t, top)
	require.NoError(t, w.Resize(ctx, 1), "a shrink withholds a free token")
	require.NoError(t, top.Release(ctx))
	require.NoError(t, w.Resize(ctx, 4))
	inv, err := w.Check(ctx)
	require.NoError(t, err)
	assert.True(t, inv.Healthy(), "%+v", inv)
	rep, err := w.Repair(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Minted)

	t.Log("Mutex Lock, TryLock busy, Lock woken")
	m, err := NewMutex(pool, "mutex", p)
	require.NoError(t, err)
	msem := mk("mutex", 1) // the same lock
	ml, err := m.Lock(ctx)
	require.NoError(t, err)
	_, err = m.TryLock(ctx)
	require.ErrorIs(t, err, ErrNoToken)
	got := acquireAsync(ctx, m.Lock)
	blocked(msem, 1)
	require.NoError(t, ml.Release(ctx))
	ml, ok = <-got
	require.True(t, ok)
	require.NoError(t, ml.Release(ctx))

	t.Log("rate.Gate Allow, Allow refused, Wait contended, Wait cancelled; WaitHolding")
	g, err := rate.New(pool, "rate", 2, 400*time.Millisecond, rate.WithPrefix(prefix))
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		_, err = g.Allow(ctx)
		require.NoError(t, err)
	}
	_, err = g.Allow(ctx)
	require.ErrorIs(t, err, rate.ErrRateLimited)
	waited := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { _, err := g.Wait(ctx); waited <- err }()
	}
	gctx, gcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = g.Wait(gctx)
	gcancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a cancelled Wait")
	assert.Equal(t, 1, tombstones(t, pool, prefix+"{rate}:rate:waits"), "the cancelled Wait's tombstone")
	for i := 0; i < 2; i++ {
		require.NoError(t, <-waited, "contended Wait")
	}
	// The cancelled Wait left the queue: once the starts are back, Allow
	// is not held up behind it.
	time.Sleep(600 * time.Millisecond)
	_, err = g.Allow(ctx)
	require.NoError(t, err, "Allow after the cancelled Wait")
	gs := mk("gated", 1)
	gl, err := gs.Acquire(ctx)
	require.NoError(t, err)
	_, err = g.WaitHolding(ctx, gl)
	require.NoError(t, err)
	gl2, err := gs.TryAcquire(ctx)
	require.ErrorIs(t, err, ErrNoToken)
	_, err = g.AllowHolding(ctx, gl2)
	require.Error(t, err)
	require.NoError(t, gl.Release(ctx))

	t.Log("rate.Gate Status, rate.ReadStatus; admin.Handle Status, Check, Reclaim")
	gst, err := g.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, gst.Limit)
	rst, err := rate.ReadStatus(ctx, pool, prefix, "rate")
	require.NoError(t, err)
	assert.Equal(t, gst.Limit, rst.Limit)
	adm, err := admin.New(pool, prefix, w.Name())
	require.NoError(t, err)
	ast, err := adm.Status(ctx)
	require.NoError(t, err)
	assert.True(t, ast.Exists)
	ainv, err := adm.Check(ctx)
	require.NoError(t, err)
	assert.True(t, ainv.Healthy(), "%+v", ainv)
	_, err = adm.Reclaim(ctx)
	require.NoError(t, err)

	t.Log("RWMutex: RLock, TryRLock, Lock blocked behind readers, a cancelled Lock, Refresh, Release, Status")
	rw, err := NewRWMutex(pool, "rw", WithPrefix(prefix), WithTTL(time.Second))
	require.NoError(t, err)
	r1, err := rw.RLock(ctx)
	require.NoError(t, err)
	r2, err := rw.TryRLock(ctx)
	require.NoError(t, err)
	lctx, lcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = rw.Lock(lctx)
	lcancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a cancelled Lock")
	locked := make(chan error, 1)
	go func() {
		l, err := rw.Lock(ctx)
		if err == nil {
			err = l.Release(ctx)
		}
		locked <- err
	}()
	require.NoError(t, r1.Refresh(ctx, 2*time.Second))
	rst2, err := rw.Status(ctx)
	require.NoError(t, err)
	assert.Len(t, rst2.Readers, 2)
	require.NoError(t, r1.Release(ctx))
	require.NoError(t, r2.Release(ctx))
	require.NoError(t, <-locked, "the Lock behind the readers")

	require.Empty(t, drain(errs))

	t.Log("Election: Observe, Campaign, a second Campaign waiting, Proclaim, Leader, Resign, a crashed leader's deadline")
	el, err := NewElection(pool, "el", WithPrefix(prefix), WithTTL(2*time.Second)) // long enough that a loaded machine keeps its leader
	require.NoError(t, err)
	changes := make(chan Leader, 16)
	octx, ocancel := context.WithCancel(ctx)
	observed := make(chan error, 1)
	go func() { observed <- el.Observe(octx, func(l Leader) { changes <- l }) }()
	require.Equal(t, Leader{}, <-changes)
	lead, err := el.Campaign(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "a", (<-changes).Value)
	next := make(chan *Leadership, 1)
	go func() {
		l, _ := el.Campaign(ctx, "b")
		next <- l
	}()
	require.NoError(t, lead.Proclaim(ctx, "a2"))
	require.Equal(t, "a2", (<-changes).Value)
	cur, err := el.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "a2", cur.Value)
	require.NoError(t, lead.Resign(ctx))
	require.Equal(t, Leader{}, <-changes)
	b := <-next
	require.NotNil(t, b)
	require.Equal(t, "b", (<-changes).Value)
	require.NoError(t, b.lease.Release(ctx)) // gone without a resign: the observer's own wake finds it
	require.Equal(t, Leader{}, <-changes)
	ocancel()
	require.ErrorIs(t, <-observed, context.Canceled)

	t.Log("Delete every name")
	for _, s := range []*Semaphore{sem, w, msem, gs} {
		require.NoError(t, s.Delete(ctx), s.Name())
	}
}

// tombstones counts the "x:" members of the waits zset key: one per
// cancelled acquisition whose abort script ran to the end.
func tombstones(t *testing.T, pool *redis.Pool, key string) int {
	return prefixedMembers(t, pool.Get(), key, "x:")
}

// prefixedMembers counts the members of zset key that start with prefix,
// on c, which it closes.
func prefixedMembers(t *testing.T, c redis.Conn, key, prefix string) int {
	t.Helper()
	defer c.Close()
	members, err := redis.Strings(c.Do("ZRANGE", key, 0, -1))
	require.NoError(t, err)
	n := 0
	for _, m := range members {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// drain returns the errors sent to errs so far.
func drain(errs chan error) []error {
	var out []error
	for {
		select {
		case err := <-errs:
			out = append(out, err)
		default:
			return out
		}
	}
}
