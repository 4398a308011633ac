// Package behaviour is redsem's behaviour suite written against the public
// API only, so that any redsem.Pool can be held to it: redigo's pool in the
// root module, the go-redis adapter in the goredis module. Every test runs
// in parallel with the others on one Redis, each under names of its own.
//
// Run it from a test:
//
//	func TestBehaviour_redigo(t *testing.T) {
//		behaviour.Run(t, behaviour.Target{Pool: pool})
//	}
package behaviour

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

// Target is the Redis and the client under test.
type Target struct {
	// Pool is the client under test. Every test gets its connections from
	// it, including the commands the tests run themselves (a key of the
	// wrong type, SCRIPT FLUSH), so on a cluster it must route by key.
	Pool redsem.Pool
	// FlushScripts empties the script cache of every node the tests' keys
	// may live on. Nil: SCRIPT FLUSH through Pool, enough for one server.
	FlushScripts func(t *testing.T)
	// Blocked counts the clients blocked in a command on the node that
	// serves key. Nil: INFO clients through Pool, enough for one server.
	Blocked func(t *testing.T, key string) int
}

// CancelBound is the documented bound on how long a cancelled Acquire takes
// to return after its context ends.
const CancelBound = 250 * time.Millisecond

// Run runs every behaviour test against tg, each as a parallel subtest.
func Run(t *testing.T, tg Target) {
	tests := []struct {
		name   string
		f      func(t *testing.T, e *env)
		serial bool // runs alone, before the others
	}{
		{"FIFOHandoff", testFIFOHandoff, true},
		{"AcquireRelease", testAcquireRelease, false},
		{"TryAcquire", testTryAcquire, false},
		{"SharedWaiters", testSharedWaiters, false},
		{"Hammer", testHammer, false},
		{"FencesIncrease", testFencesIncrease, false},
		{"RefreshAndExpiry", testRefreshAndExpiry, false},
		{"CancelledAcquire", testCancelledAcquire, false},
		{"DeadlineAcquire", testDeadlineAcquire, false},
		{"AcquireN", testAcquireN, false},
		{"Resize", testResize, false},
		{"CheckStatus", testCheckStatus, false},
		{"Delete", testDelete, false},
		{"WrongType", testWrongType, false},
		{"ShrinkWhileWaiting", testShrinkWhileWaiting, false},
		{"ReleaseEndedContext", testReleaseEndedContext, false},
		{"DroppedLeaseExpires", testDroppedLeaseExpires, false},
		{"SizeMismatch", testSizeMismatch, false},
		{"NoScript", testNoScript, false},
		{"NoScriptWhileWaiting", testNoScriptWhileWaiting, false},
		{"Mutex", testMutex, false},
		{"RateGateAllow", testRateGateAllow, false},
		{"RateGateWait", testRateGateWait, false},
		{"RateQuota", testRateQuota, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.serial {
				t.Parallel()
			}
			tc.f(t, &env{tg: tg, name: "bt-" + tc.name + "-" + randHex()})
		})
	}
}

// env is one test's view of the target: a name of its own and helpers.
type env struct {
	tg   Target
	name string
}

func randHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ctx returns a context that ends when the test does, or after d.
func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// sem opens the test's semaphore (or the one called suffix) with size n.
func (e *env) sem(t *testing.T, n int, opts ...redsem.Option) *redsem.Semaphore {
	t.Helper()
	s, err := redsem.NewSemaphore(e.tg.Pool, e.name, n, opts...)
	require.NoError(t, err)
	return s
}

// do runs one command through the pool under test.
func (e *env) do(t *testing.T, cmd string, args ...interface{}) interface{} {
	t.Helper()
	c, err := e.tg.Pool.GetContext(ctx(t, 10*time.Second))
	require.NoError(t, err)
	defer c.Close()
	v, err := c.Do(cmd, args...)
	require.NoError(t, err, "%s %v", cmd, args)
	return v
}

// key is the name of one of the semaphore's keys ("tokens", "meta", ...).
func (e *env) key(part string) string {
	return redsem.DefaultPrefix + "{" + e.name + "}:" + part
}

func (e *env) flushScripts(t *testing.T) {
	if e.tg.FlushScripts != nil {
		e.tg.FlushScripts(t)
		return
	}
	e.do(t, "SCRIPT", "FLUSH")
}

// adm is an admin.Handle for the test's name: every semaphore of a test
// is the one called e.name under the default prefix. It may be called from
// any goroutine.
func (e *env) adm() *admin.Handle {
	h, err := admin.New(e.tg.Pool, redsem.DefaultPrefix, e.name)
	if err != nil {
		panic(err) // New only checks its arguments, valid here by construction
	}
	return h
}

// requireWhole checks that the semaphore's inventory is whole, with free
// tokens free and held leases.
func (e *env) requireWhole(t *testing.T, free, held int) {
	t.Helper()
	inv, err := e.adm().Check(ctx(t, 10*time.Second))
	require.NoError(t, err)
	require.True(t, inv.Healthy(), "inventory: %+v", inv)
	require.Len(t, inv.Free, free, "inventory: %+v", inv)
	require.Len(t, inv.Leased, held, "inventory: %+v", inv)
}

// WaitFor polls cond every 5ms until it holds, and fails t after d.
func WaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// blocked is how many clients are blocked in a command on the node of the
// test's keys.
func (e *env) blocked(t *testing.T) int {
	if e.tg.Blocked != nil {
		return e.tg.Blocked(t, e.key("tokens"))
	}
	info, err := redis.String(e.do(t, "INFO", "clients"), nil)
	require.NoError(t, err)
	return BlockedClients(info)
}

// BlockedClients reads blocked_clients from the text of INFO clients.
func BlockedClients(info string) int {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return -1
}

// waiting is how many acquisitions Redis records as blocked on the test's
// semaphore.
func (e *env) waiting(t *testing.T) int {
	st, err := e.adm().Status(context.Background())
	if err != nil {
		t.Errorf("status: %v", err)
		return -1
	}
	return st.Waiting
}
