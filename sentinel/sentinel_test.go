package sentinel

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/redistest"
)

// The sentinel tests share one topology (a master, two replicas, three
// sentinels) and run in order: the failovers change who is master.
func TestSentinel(t *testing.T) {
	t.Parallel()
	start := time.Now()
	set := redistest.StartSentinels(t, redistest.SentinelOptions{})
	t.Logf("master, 2 replicas and 3 sentinels up in %v", time.Since(start).Round(time.Millisecond))
	p := newPool(t, set)

	t.Run("Discover", func(t *testing.T) { testDiscover(t, set, p) })
	t.Run("Role", func(t *testing.T) { testRole(t, set, p) })
	t.Run("FailoverUnderLoad", func(t *testing.T) { testFailoverUnderLoad(t, set, p) })
	t.Run("ConnectDuringFailover", func(t *testing.T) { testConnectDuringFailover(t, set, p) })
}

func newPool(t testing.TB, set *redistest.Sentinels, opts ...Option) *Pool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := New(ctx, set.Addrs(), redistest.SentinelName, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func testDiscover(t *testing.T, set *redistest.Sentinels, p *Pool) {
	assert.Equal(t, set.Master().Addr, p.Master())
	sem, err := redsem.NewSemaphore(p, "discover", 2)
	require.NoError(t, err)
	l, err := sem.Acquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctxT(t, 5*time.Second)))
	assert.Positive(t, p.Stats().Discoveries)

	_, err = New(ctxT(t, 5*time.Second), set.Addrs(), "no-such-master")
	assert.ErrorIs(t, err, ErrUnknownMaster)
}

// testRole: a node that answers ROLE as a replica is refused on dial, as a
// demoted master that has not yet learned of the failover would be.
func testRole(t *testing.T, set *redistest.Sentinels, p *Pool) {
	var replica string
	for _, n := range set.Data {
		if n.Addr != p.Master() {
			replica = n.Addr
		}
	}
	p.mu.Lock()
	p.master = replica // as if the sentinels had just named it
	p.mu.Unlock()
	_, err := p.dial(ctxT(t, 5*time.Second), replica)
	require.ErrorIs(t, err, ErrNotMaster)
	assert.Positive(t, p.Stats().NotMaster)
	p.forget(replica, true)

	// A write that reaches a replica anyway comes back as a FailoverError,
	// not as a Redis error reply, and the Pool asks the sentinels again.
	raw, err := redis.Dial("tcp", replica)
	require.NoError(t, err)
	c := &conn{p: p, inner: raw, addr: replica}
	_, err = c.Do("SET", "k", "v")
	c.Close()
	var fe *FailoverError
	require.ErrorAs(t, err, &fe)
	var re redis.Error
	assert.False(t, errors.As(err, &re), "a FailoverError must not be a redis.Error")

	conn, err := p.GetContext(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	_, err = conn.Do("SET", "k", "v")
	conn.Close()
	require.NoError(t, err)
	assert.Equal(t, set.Master().Addr, p.Master())
}

// load runs holders goroutines acquiring and releasing on sem until stop is
// closed, and checks that no more than size hold at once. acquired counts
// each holder's grants.
type load struct {
	held, maxHeld atomic.Int64
	acquired      []atomic.Int64
	errs          chan error
	wg            sync.WaitGroup
	mu            sync.Mutex
	grants        []time.Time
}

// maxGap is the longest time with no grant to anyone.
func (ld *load) maxGap() time.Duration {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	var gap time.Duration
	for i := 1; i < len(ld.grants); i++ {
		gap = max(gap, ld.grants[i].Sub(ld.grants[i-1]))
	}
	return gap
}

func runLoad(sem *redsem.Semaphore, holders int, stop chan struct{}) *load {
	ld := &load{acquired: make([]atomic.Int64, holders), errs: make(chan error, 1000)}
	for g := 0; g < holders; g++ {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				l, err := sem.Acquire(ctx)
				cancel()
				if err != nil {
					select {
					case ld.errs <- err:
					default:
					}
					time.Sleep(20 * time.Millisecond)
					continue
				}
				n := ld.held.Add(1)
				for m := ld.maxHeld.Load(); n > m && !ld.maxHeld.CompareAndSwap(m, n); m = ld.maxHeld.Load() {
				}
				ld.acquired[g].Add(1)
				ld.mu.Lock()
				ld.grants = append(ld.grants, time.Now())
				ld.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				ld.held.Add(-1)
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				_ = l.Release(rctx)
				rcancel()
			}
		}()
	}
	return ld
}

func (ld *load) counts() []int64 {
	out := make([]int64, len(ld.acquired))
	for i := range ld.acquired {
		out[i] = ld.acquired[i].Load()
	}
	return out
}

func testFailoverUnderLoad(t *testing.T, set *redistest.Sentinels, p *Pool) {
	const size, holders = 2, 5
	sem, err := redsem.NewSemaphore(p, "failover", size, redsem.WithTTL(3*time.Second))
	require.NoError(t, err)
	stop := make(chan struct{})
	ld := runLoad(sem, holders, stop)
	time.Sleep(500 * time.Millisecond)
	old := set.Master()
	before := ld.counts()
	m, took, err := set.Failover(20 * time.Second)
	require.NoError(t, err)
	t.Logf("SENTINEL FAILOVER: %s -> %s in %v (until every sentinel named the new master)", old.Addr, m.Addr, took.Round(time.Millisecond))
	// Every holder gets a grant on the new master.
	mid := ld.counts()
	ok := assert.Eventually(t, func() bool {
		now := ld.counts()
		for i := range now {
			if now[i] <= mid[i] {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "a holder did not acquire after the failover")
	close(stop)
	ld.wg.Wait()
	close(ld.errs)
	var errs []error
	for err := range ld.errs {
		errs = append(errs, err)
	}
	after := ld.counts()
	t.Logf("grants per holder before/at/after the failover: %v %v %v; longest time without a grant: %v; acquire errors: %d %v; stats %+v",
		before, mid, after, ld.maxGap().Round(time.Millisecond), len(errs), errs, p.Stats())
	require.True(t, ok)
	assert.Equal(t, m.Addr, p.Master(), "the pool does not use the new master")
	assert.LessOrEqual(t, ld.maxHeld.Load(), int64(size), "more holders than the size")
	assert.Positive(t, p.Stats().Switches)
	// No token lost: the new master has them all back.
	ops, err := admin.New(p, redsem.DefaultPrefix, "failover")
	require.NoError(t, err)
	st, err := ops.Status(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, size, st.Available, "tokens on the new master: %+v", st)
	assert.Empty(t, st.Holders)
}

// testConnectDuringFailover: the master is killed; a client that starts
// then waits within its context for the new master instead of failing, and
// one whose context is too short for the failover fails with that context's
// error after waiting it out.
func testConnectDuringFailover(t *testing.T, set *redistest.Sentinels, p *Pool) {
	old := set.Master()
	old.Kill()
	killed := time.Now()

	short := time.Now()
	_, err := New(ctxT(t, 300*time.Millisecond), set.Addrs(), redistest.SentinelName)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, ErrNoMaster)
	assert.GreaterOrEqual(t, time.Since(short), 250*time.Millisecond, "a client during the failover failed fast: %v", err)

	q, err := New(ctxT(t, 30*time.Second), set.Addrs(), redistest.SentinelName)
	require.NoError(t, err, "a client that connects during the failover must wait for it")
	defer q.Close()
	connected := time.Since(killed)
	sem, err := redsem.NewSemaphore(q, "failover", 2)
	require.NoError(t, err)
	l, err := sem.Acquire(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctxT(t, 5*time.Second)))
	m, err := set.WaitNewMaster(old, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, m.Addr, q.Master())
	// The long-lived pool follows too.
	c, err := p.GetContext(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	_, err = c.Do("PING")
	c.Close()
	require.NoError(t, err)
	assert.Equal(t, m.Addr, p.Master())
	t.Logf("kill -9 of the master %s: a new client connected to %s %v after the kill", old.Addr, m.Addr, connected.Round(time.Millisecond))
}

// TestAuth: sentinels and data nodes that require different passwords;
// the Pool needs each password on its own side, and a configuration with
// the two swapped, or one missing, finds no master.
func TestAuth(t *testing.T) {
	t.Parallel()
	const dataPW, sentPW = "d4ta-pw", "s3ntinel-pw"
	set := redistest.StartSentinels(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1,
		Password: dataPW, SentinelPassword: sentPW})
	p := newPool(t, set, WithDialOptions(redis.DialPassword(dataPW)), WithSentinelDialOptions(redis.DialPassword(sentPW)))
	sem, err := redsem.NewSemaphore(p, "auth", 1)
	require.NoError(t, err)
	l, err := sem.Acquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctxT(t, 5*time.Second)))

	for _, tc := range []struct {
		what string
		opts []Option
		want string
	}{
		{"swapped", []Option{WithDialOptions(redis.DialPassword(sentPW)), WithSentinelDialOptions(redis.DialPassword(dataPW))}, "WRONGPASS"},
		{"sentinels' password on both sides", []Option{WithDialOptions(redis.DialPassword(sentPW)), WithSentinelDialOptions(redis.DialPassword(sentPW))}, "WRONGPASS"},
		{"data nodes' password on both sides", []Option{WithDialOptions(redis.DialPassword(dataPW)), WithSentinelDialOptions(redis.DialPassword(dataPW))}, "WRONGPASS"},
		{"no sentinel password", []Option{WithDialOptions(redis.DialPassword(dataPW))}, "NOAUTH"},
		{"no data node password", []Option{WithSentinelDialOptions(redis.DialPassword(sentPW))}, "NOAUTH"},
	} {
		_, err = New(ctxT(t, 5*time.Second), set.Addrs(), redistest.SentinelName,
			append(tc.opts, WithFailoverWait(300*time.Millisecond))...)
		require.ErrorIs(t, err, ErrNoMaster, tc.what)
		assert.Contains(t, err.Error(), tc.want, tc.what)
	}
}

// TestTLS: sentinels and data nodes that listen on TLS only (a CA and
// certificates generated here); the Pool finds the master through the
// sentinels, serves a semaphore and follows a failover, all over TLS. TLS on
// one side only, or without the CA, finds no master.
func TestTLS(t *testing.T) {
	t.Parallel()
	tc := redistest.NewTLS(t)
	set := redistest.StartSentinels(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1, TLS: tc})
	withTLS := []redis.DialOption{redis.DialUseTLS(true), redis.DialTLSConfig(tc.Config)}
	p := newPool(t, set, WithDialOptions(withTLS...), WithSentinelDialOptions(withTLS...))
	sem, err := redsem.NewSemaphore(p, "tls", 1)
	require.NoError(t, err)
	l, err := sem.Acquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctxT(t, 5*time.Second)))

	old := set.Master()
	// A sentinel that has just met the replica may not find it good yet
	// (NOGOODSLAVE): ask again for a while.
	var (
		m    *redistest.Server
		took time.Duration
	)
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m, took, err = set.Failover(30 * time.Second)
		if err == nil || !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(end) {
			break
		}
	}
	require.NoError(t, err)
	require.NotEqual(t, old.Addr, m.Addr)
	t.Logf("failover over TLS in %v", took.Round(time.Millisecond))
	ctx := ctxT(t, 20*time.Second)
	for {
		l, err = sem.Acquire(ctx)
		if err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "no grant after the failover: %v", err)
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, m.Addr, p.Master(), "the pool follows the new master")
	require.NoError(t, l.Release(ctxT(t, 5*time.Second)))

	for _, bad := range []struct {
		what string
		opts []Option
	}{
		{"plain TCP to the sentinels", []Option{WithDialOptions(withTLS...)}},
		{"plain TCP to the data nodes", []Option{WithSentinelDialOptions(withTLS...)}},
		{"TLS without the CA", []Option{WithDialOptions(redis.DialUseTLS(true)), WithSentinelDialOptions(redis.DialUseTLS(true))}},
	} {
		_, err = New(ctxT(t, 5*time.Second), set.Addrs(), redistest.SentinelName,
			append(bad.opts, WithFailoverWait(300*time.Millisecond))...)
		require.ErrorIs(t, err, ErrNoMaster, bad.what)
		t.Logf("%s -> %v", bad.what, err)
	}
}
