package redsem

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redsem/redsem/internal/redistest"
)

func TestMain(m *testing.M) {
	// This package's parallel tests mostly wait (on a TTL, a stopped
	// server, a blocked command), each on servers of its own.
	redistest.MoreParallel(8)
	if os.Getenv("REDSEM_ALONE") != "" {
		// A test's own process (alone): it ends with its parent, whose
		// pipe on its stdin then reaches EOF.
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			fmt.Fprintln(os.Stderr, "the parent test process ended")
			os.Exit(2)
		}()
	}
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent())
}

// alone runs the calling test by itself, in a child process of the test
// binary, and reports the child's outcome as its own; in that child it
// returns true and the test goes on. It is for the tests that swap what the
// whole process shares (engine.Clk, the scripts, failpoints) or judge a
// timer against the clock: in a process of their own they need not run
// serially, holding up every other test, and no parallel test of this
// package shares their Go scheduler. Call it first, in a top-level test:
//
//	if !alone(t) {
//		return
//	}
//
// The child gets -short, -skip and the subtest part of -run; it exits when
// the parent dies (its stdin, a pipe the parent holds, reaches EOF).
func alone(t *testing.T) bool {
	t.Helper()
	if os.Getenv("REDSEM_ALONE") == t.Name() {
		return true
	}
	if strings.Contains(t.Name(), "/") {
		t.Fatal("alone is for top-level tests")
	}
	t.Parallel()
	run := "^" + regexp.QuoteMeta(t.Name()) + "$"
	if f := flag.Lookup("test.run"); f != nil {
		if _, sub, ok := strings.Cut(f.Value.String(), "/"); ok {
			run += "/" + sub
		}
	}
	args := []string{"-test.run=" + run, "-test.count=1", "-test.v"}
	for _, name := range []string{"test.short", "test.skip"} {
		if f := flag.Lookup(name); f != nil && flagSet(name) {
			args = append(args, "-"+name+"="+f.Value.String())
		}
	}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+max(time.Until(d)*9/10, time.Second).Round(time.Second).String())
	}
	stdin, keep, err := os.Pipe()
	require.NoError(t, err)
	defer stdin.Close()
	defer keep.Close()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "REDSEM_ALONE="+t.Name())
	cmd.Stdin = stdin
	// Say so while it runs, as a test of this process would by its output
	// (a harness may take a minute of silence for a hang).
	start, done, ticked := time.Now(), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ticked)
		tick := time.NewTicker(15 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				t.Logf("running in a process of its own for %v", time.Since(start).Round(time.Second))
			case <-done:
				return
			}
		}
	}()
	out, err := cmd.CombinedOutput()
	close(done)
	<-ticked
	switch {
	case err != nil:
		t.Fatalf("%s, in a process of its own: %v\n%s", t.Name(), err, out)
	case bytes.Contains(out, []byte("--- SKIP: "+t.Name()+" ")):
		t.Skipf("skipped in a process of its own:\n%s", out)
	case !bytes.Contains(out, []byte("--- PASS: "+t.Name()+" ")):
		t.Fatalf("%s did not run in a process of its own:\n%s", t.Name(), out)
	case testing.Verbose():
		t.Logf("in a process of its own:\n%s", out)
	}
	return false
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// backend is a Redis to run a behaviour test against: miniredis in process,
// or a real redis-server the test starts on a free port, through a client.
type backend struct {
	name string
	pool testPool
	addr string
	mini *miniredis.Miniredis
	srv  *redistest.Server
}

// testPool is what the tests need of a backend's client: a Pool that also
// hands out a connection without a context, as redigo's does.
type testPool interface {
	Pool
	Get() redis.Conn
}

// extraBackend is one more client for eachBackend's tests. The goredis
// module's TestRootSuite builds this package with a file that adds go-redis
// here (a real redis-server through goredis.Pool), so the whole behaviour
// suite runs on both clients while this module never imports go-redis.
type extraBackend struct {
	name  string
	start func(t *testing.T) *backend
}

var extraBackends []extraBackend

// eachBackend runs f against miniredis and against a real redis-server
// (through redigo), and against every extra backend. REDSEM_BACKENDS, a
// comma-separated list of names, runs only those.
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	run := func(name string, start func(t *testing.T) *backend) {
		if !backendSelected(name) {
			return
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, start(t))
		})
	}
	run("miniredis", func(t *testing.T) *backend {
		m := miniredis.RunT(t)
		return &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	})
	run("redis", func(t *testing.T) *backend {
		s := redistest.Start(t)
		return &backend{name: "redis", srv: s, addr: s.Addr, pool: s.Pool(t)}
	})
	for _, e := range extraBackends {
		run(e.name, e.start)
	}
}

// longRun reports whether REDSEM_LONG=1 asks for the long runs: the
// explorations with their long budgets (exploreBudget). Without it every
// test still runs, with budgets that fit the README's test command; CI runs
// the long ones in a step of their own (.ci/run).
func longRun() bool { return os.Getenv("REDSEM_LONG") == "1" }

// realRedisRuns reports whether eachBackend runs its tests on a real
// redis-server too: one is on PATH and REDSEM_BACKENDS leaves it in.
func realRedisRuns() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil && backendSelected("redis")
}

func backendSelected(name string) bool {
	only := os.Getenv("REDSEM_BACKENDS")
	if only == "" {
		return true
	}
	for _, n := range strings.Split(only, ",") {
		if strings.TrimSpace(n) == name {
			return true
		}
	}
	return false
}

// realRedis starts a real redis-server for tests that need one.
func realRedis(t *testing.T, args ...string) *backend {
	s := redistest.Start(t, args...)
	return &backend{name: "redis", srv: s, addr: s.Addr, pool: s.Pool(t)}
}

func newPool(t testing.TB, addr string) *redis.Pool {
	p := &redis.Pool{
		MaxIdle: 64,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr)
		},
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// do runs one command on its own connection.
func (b *backend) do(t testing.TB, cmd string, args ...interface{}) interface{} {
	t.Helper()
	c, err := redis.Dial("tcp", b.addr)
	require.NoError(t, err)
	defer c.Close()
	v, err := c.Do(cmd, args...)
	require.NoError(t, err, "%s %v", cmd, args)
	return v
}

// read runs a read-only command as do does, trying a fresh connection
// again (three times at most) when one fails before its reply: a poll's
// thousands of dials on a loaded machine met a reset one.
func (b *backend) read(t testing.TB, cmd string, args ...interface{}) interface{} {
	t.Helper()
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c redis.Conn
		if c, err = redis.Dial("tcp", b.addr); err != nil {
			continue
		}
		var v interface{}
		v, err = c.Do(cmd, args...)
		c.Close()
		if _, isReply := err.(redis.Error); err == nil || isReply {
			require.NoError(t, err, "%s %v", cmd, args)
			return v
		}
	}
	require.NoError(t, err, "%s %v", cmd, args)
	return nil
}

func (b *backend) llen(t testing.TB, key string) int {
	n, err := redis.Int(b.read(t, "LLEN", key), nil)
	require.NoError(t, err)
	return n
}

func (b *backend) zcard(t testing.TB, key string) int {
	n, err := redis.Int(b.read(t, "ZCARD", key), nil)
	require.NoError(t, err)
	return n
}

// lapse makes the leases of toks on s expire a second ago by the server's
// clock, and lowers meta's due with them, as if their TTL had run out: a
// test that needs a lapsed lease gets one whatever the machine's speed.
func (b *backend) lapse(t testing.TB, s *Semaphore, toks ...string) {
	t.Helper()
	now, err := redis.Int64s(b.do(t, "TIME"), nil)
	require.NoError(t, err)
	past := now[0]*1000 + now[1]/1000 - 1000
	for _, tok := range toks {
		require.Equal(t, int64(1), b.do(t, "ZADD", s.k.leases, "XX", "CH", past, tok), "%s is not leased", tok)
	}
	b.do(t, "HSET", s.k.meta, "due", past)
}

// keyCount counts the keys in the database.
func (b *backend) keyCount(t testing.TB) int {
	n, err := redis.Int(b.read(t, "DBSIZE"), nil)
	require.NoError(t, err)
	return n
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newSem(t testing.TB, b *backend, name string, size int, opts ...Option) *Semaphore {
	t.Helper()
	s, err := NewSemaphore(b.pool, name, size, opts...)
	require.NoError(t, err)
	return s
}

// requireInventory checks that the semaphore holds exactly size valid free
// tokens, no lease, and nothing stray.
func requireInventory(t testing.TB, s *Semaphore, free, held int) {
	t.Helper()
	st, err := s.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, free, st.Available, "available tokens: %+v", st)
	require.Len(t, st.Holders, held, "holders: %+v", st)
	require.Equal(t, 0, st.Stray, "stray tokens: %+v", st)
}

func init() {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
}

func miniredisT(t *testing.T) *miniredis.Miniredis { return miniredis.RunT(t) }

// acquireAsync runs acquire in a goroutine. The channel yields the lease, or
// is closed without one if acquire failed.
func acquireAsync(ctx context.Context, acquire func(context.Context) (*Lease, error)) <-chan *Lease {
	got := make(chan *Lease, 1)
	go func() {
		l, err := acquire(ctx)
		if err != nil {
			close(got)
			return
		}
		got <- l
	}()
	return got
}

// holdN acquires n leases with acquire (Acquire or TryAcquire), failing the
// test if any acquisition fails.
func holdN(t testing.TB, ctx context.Context, acquire func(context.Context) (*Lease, error), n int) []*Lease {
	t.Helper()
	var ls []*Lease
	for i := 0; i < n; i++ {
		l, err := acquire(ctx)
		require.NoError(t, err)
		ls = append(ls, l)
	}
	return ls
}
