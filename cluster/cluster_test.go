package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/cluster"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// The cluster tests share one 3-master, 3-replica cluster and run in order:
// each leaves the cluster stable and every semaphore settled.
func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := redistest.StartCluster(t, 3, 1)
	t.Logf("cluster of 6 up in %v", time.Since(start).Round(time.Millisecond))
	p := newPool(t, c)

	t.Run("Keyslot", func(t *testing.T) { testKeyslot(t, c) })
	t.Run("Routing", func(t *testing.T) { testRouting(t, c, p) })
	t.Run("Spread", func(t *testing.T) { testSpread(t, c, p) })
	t.Run("Fleet", func(t *testing.T) { testFleet(t, c, p) })
	t.Run("Reshard", func(t *testing.T) { testReshard(t, c, p) })
	t.Run("Failover", func(t *testing.T) { testFailover(t, c, p) })
	t.Run("Wait", func(t *testing.T) { testWait(t, c) })
}

func newPool(t testing.TB, c *redistest.Cluster, opts ...cluster.Option) *cluster.Pool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := cluster.New(ctx, c.Addrs(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

func testKeyslot(t *testing.T, c *redistest.Cluster) {
	conn, err := redis.Dial("tcp", c.Nodes[0].Addr)
	require.NoError(t, err)
	defer conn.Close()
	keys := []string{"", "}", "{", "{}", "{a}", "a}b", "a{b", "foo{}{bar}", "{{x}}", "redsem:{x}:pend:abc",
		"redsem:{%7B%7D}:meta", strings.Repeat("é", 300)}
	for i := 0; i < 200; i++ {
		keys = append(keys, fmt.Sprintf("k%d{t%d}%c", i, i%7, 'a'+rune(i%26)))
	}
	for _, k := range keys {
		want, err := redis.Int(conn.Do("CLUSTER", "KEYSLOT", k))
		require.NoError(t, err)
		assert.Equal(t, want, cluster.Slot(k), "key %q", k)
	}
}

func testRouting(t *testing.T, c *redistest.Cluster, p *cluster.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := p.GetContext(ctx)
	require.NoError(t, err)
	defer conn.Close()
	// Keys on every master, through one routing connection.
	byMaster := map[string]int{}
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("route:%d", i)
		_, err := redis.DoContext(conn, ctx, "SET", k, i)
		require.NoError(t, err)
		v, err := redis.Int(conn.Do("GET", k))
		require.NoError(t, err)
		assert.Equal(t, i, v)
		byMaster[p.MasterOf(k)]++
	}
	assert.Len(t, byMaster, 3)
	_, err = redis.String(conn.Do("PING"))
	require.NoError(t, err)

	// A pipeline stays on the node of its first key.
	require.NoError(t, conn.Send("SET", "{pipe}a", "1"))
	require.NoError(t, conn.Send("INCR", "{pipe}a"))
	require.NoError(t, conn.Flush())
	_, err = conn.Receive()
	require.NoError(t, err)
	n, err := redis.Int(conn.Receive())
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	// MOVED: move a key's slot behind the pool's back, then use it.
	key := "route:moved"
	_, err = conn.Do("SET", key, "v")
	require.NoError(t, err)
	slot := cluster.Slot(key)
	dst := otherMaster(t, c, c.Owner(slot))
	_, err = c.MoveSlot(slot, dst, nil)
	require.NoError(t, err)
	before := p.Stats()
	v, err := redis.String(conn.Do("GET", key))
	require.NoError(t, err)
	assert.Equal(t, "v", v)
	assert.Greater(t, p.Stats().Moved, before.Moved)
	assert.Eventually(t, func() bool { return p.MasterOf(key) == dst.Addr }, 2*time.Second, 20*time.Millisecond)

	// ASK: with the slot migrating and the key already on the target, a
	// command is served there after ASKING.
	key = "route:ask"
	_, err = conn.Do("SET", key, "w")
	require.NoError(t, err)
	slot = cluster.Slot(key)
	src := c.Owner(slot)
	dst = otherMaster(t, c, src)
	before = p.Stats()
	_, err = c.MoveSlot(slot, dst, func(round int) bool {
		if round == 1 { // the key has moved, the slot is still migrating
			v, err := redis.String(conn.Do("GET", key))
			assert.NoError(t, err)
			assert.Equal(t, "w", v)
		}
		return round < 1
	})
	require.NoError(t, err)
	assert.Greater(t, p.Stats().Ask, before.Ask)
	c.WaitStable(10 * time.Second)
}

func otherMaster(t *testing.T, c *redistest.Cluster, not *redistest.Server) *redistest.Server {
	for _, m := range c.Masters() {
		if m != not {
			return m
		}
	}
	t.Fatal("no other master")
	return nil
}

// load runs workers that acquire a random semaphore of sems, hold it, and
// release it, until ctx ends; it checks that no semaphore ever has more
// holders than its size.
type load struct {
	sems     []*redsem.Semaphore
	holders  []atomic.Int32
	acquired atomic.Int64
	over     atomic.Int64
	mu       sync.Mutex
	errs     []error
	wg       sync.WaitGroup
}

func startLoad(ctx context.Context, sems []*redsem.Semaphore, workers int, hold time.Duration) *load {
	l := &load{sems: sems, holders: make([]atomic.Int32, len(sems))}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				i := rand.IntN(len(sems))
				l.once(ctx, i, hold)
			}
		}()
	}
	return l
}

func (l *load) fail(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *load) once(ctx context.Context, i int, hold time.Duration) {
	s := l.sems[i]
	actx, cancel := context.WithTimeout(ctx, 8*time.Second)
	lease, err := s.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			l.fail(fmt.Errorf("acquire %s: %w", s.Name(), err))
		}
		return
	}
	l.acquired.Add(1)
	if n := l.holders[i].Add(1); int(n) > s.Size() {
		l.over.Add(1)
	}
	time.Sleep(hold)
	l.holders[i].Add(-1)
	rctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if err := lease.Release(rctx); err != nil {
		l.fail(fmt.Errorf("release %s: %w", s.Name(), err))
	}
}

// stop waits for the workers and checks what they saw.
func (l *load) stop(t *testing.T) {
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Zero(t, l.over.Load(), "more holders than tokens")
	if !assert.Empty(t, l.errs) {
		for i, e := range l.errs {
			if i < 10 {
				t.Log(e)
			}
		}
	}
	assert.Positive(t, l.acquired.Load())
}

// settled checks that every semaphore is back to all of its tokens free and
// no holder, reclaiming what stranded pending lists hold (within a bound).
func settled(t *testing.T, p redsem.Pool, prefix string, sems ...*redsem.Semaphore) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, s := range sems {
		ops, err := admin.New(p, prefix, s.Name())
		require.NoError(t, err)
		var st admin.Status
		for ctx.Err() == nil {
			st, err = ops.Status(ctx)
			if err == nil && st.Available == s.Size() && len(st.Holders) == 0 {
				break
			}
			_, _ = ops.Reclaim(ctx)
			time.Sleep(50 * time.Millisecond)
		}
		if assert.NoError(t, err, s.Name()) {
			assert.Equal(t, s.Size(), st.Available, "free tokens of %s", s.Name())
			assert.Empty(t, st.Holders, "holders of %s", s.Name())
			assert.Zero(t, st.Stray, "stray tokens in %s", s.Name())
		}
	}
}

func semaphores(t *testing.T, p redsem.Pool, prefix string, n, size int, opts ...redsem.Option) []*redsem.Semaphore {
	var sems []*redsem.Semaphore
	for i := 0; i < n; i++ {
		s, err := redsem.NewSemaphore(p, fmt.Sprintf("%s%d", prefix, i), size,
			append([]redsem.Option{redsem.WithTTL(5 * time.Second), redsem.WithGrace(200 * time.Millisecond)}, opts...)...)
		require.NoError(t, err)
		sems = append(sems, s)
	}
	return sems
}

// slotOf is the slot of a semaphore's keys (its name is plain ASCII here).
func slotOf(s *redsem.Semaphore) int { return cluster.Slot("{" + s.Name() + "}") }

func testSpread(t *testing.T, c *redistest.Cluster, p *cluster.Pool) {
	sems := semaphores(t, p, "spread", 60, 2)
	per := map[string]int{}
	for _, s := range sems {
		per[p.MasterOf("{"+s.Name()+"}")]++
	}
	require.Len(t, per, 3, "semaphores on every master: %v", per)
	// Cancel, not a deadline: an Acquire may see a deadline pass before
	// ctx.Err() reports it, and the workers tell ending from failing by ctx.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := startLoad(ctx, sems, 40, 2*time.Millisecond)
	time.Sleep(3 * time.Second)
	cancel()
	l.stop(t)
	t.Logf("spread: %d semaphores over masters %v, %d acquisitions in 3s", len(sems), per, l.acquired.Load())
	settled(t, p, redsem.DefaultPrefix, sems...)
}

// A script of the library (after its helpers, as the library runs it), to
// play a waiter that dies between its BLMOVE and its lease script.
func script(t *testing.T, name string) *engine.Script {
	return engine.Lua(6, engine.Source(name))
}

// strand leaves one token of s (size 1, not held) in the pending list of a
// waiter that died after its BLMOVE, before its lease script: only the
// pending-list sweep can bring it back.
func strand(t *testing.T, p *cluster.Pool, s *redsem.Semaphore, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held, err := s.Acquire(ctx)
	require.NoError(t, err)
	base := prefix + "{" + s.Name() + "}:"
	acq := fmt.Sprintf("deadbeef%016x", rand.Uint64())
	pend := base + "pend:" + acq
	keys := []interface{}{base + "meta", base + "tokens", base + "leases", base + "holders", base + "waits", pend}
	conn, err := p.GetContext(ctx)
	require.NoError(t, err)
	defer conn.Close()
	v, err := redis.Values(script(t, "acquire.lua").DoContext(ctx, conn,
		append(keys, s.Size(), acq, 5000, "dying", 300, 200, 60000, "fresh")...))
	require.NoError(t, err)
	require.EqualValues(t, 0, v[0], "the semaphore is full")
	require.NoError(t, conn.Send("BLMOVE", base+"tokens", pend, "LEFT", "RIGHT", "5"))
	require.NoError(t, conn.Flush())
	require.NoError(t, held.Release(ctx))
	tok, err := redis.String(conn.Receive())
	require.NoError(t, err)
	require.NotEmpty(t, tok)
}

func testReshard(t *testing.T, c *redistest.Cluster, p *cluster.Pool) {
	busy := semaphores(t, p, "busy", 1, 3)
	// A semaphore in the same slot (same name, other prefix) with its only
	// token stranded in a dead waiter's pending list: the list must move
	// with the slot and be swept on the new master.
	stranded, err := redsem.NewSemaphore(p, busy[0].Name(), 1, redsem.WithPrefix("strand:"),
		redsem.WithTTL(5*time.Second), redsem.WithGrace(200*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, slotOf(busy[0]), cluster.Slot("strand:{"+busy[0].Name()+"}:tokens"))
	others := semaphores(t, p, "bystander", 6, 2)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lb := startLoad(ctx, busy, 10, 5*time.Millisecond) // 10 workers on 3 tokens: waiters block
	lo := startLoad(ctx, others, 6, 2*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	strand(t, p, stranded, "strand:")

	slot := slotOf(busy[0])
	for move := 0; move < 2; move++ {
		src := c.Owner(slot)
		dst := otherMaster(t, c, src)
		before := lb.acquired.Load()
		started := time.Now()
		n, err := c.MoveSlot(slot, dst, func(round int) bool {
			// Let the load run against the migrating slot: before any key
			// moved, and between rounds (keys the source still creates go
			// in the next round).
			time.Sleep(250 * time.Millisecond)
			return round < 2
		})
		require.NoError(t, err)
		t.Logf("move %d: slot %d %s -> %s, %d keys, %v, %d acquisitions meanwhile",
			move, slot, src.Addr, dst.Addr, n, time.Since(started).Round(time.Millisecond), lb.acquired.Load()-before)
		time.Sleep(700 * time.Millisecond)
	}
	cancel()
	lb.stop(t)
	lo.stop(t)
	t.Logf("reshard: busy %d acquisitions, bystanders %d, pool stats %+v", lb.acquired.Load(), lo.acquired.Load(), p.Stats())
	settled(t, p, redsem.DefaultPrefix, append(busy, others...)...)
	settled(t, p, "strand:", stranded)
	c.WaitStable(10 * time.Second)
}

func testFailover(t *testing.T, c *redistest.Cluster, p *cluster.Pool) {
	all := semaphores(t, p, "failover", 40, 2)
	master := c.Masters()[0]
	var sems []*redsem.Semaphore
	for _, s := range all {
		if p.MasterOf("{"+s.Name()+"}") == master.Addr {
			sems = append(sems, s)
		}
	}
	require.NotEmpty(t, sems)
	replica := c.ReplicaOf(master)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := startLoad(ctx, sems, 3*len(sems), 5*time.Millisecond) // 3 workers per 2 tokens
	time.Sleep(500 * time.Millisecond)
	before := l.acquired.Load()
	started := time.Now()
	require.NoError(t, c.Failover(replica, "", 20*time.Second))
	t.Logf("failover: %s took over from %s in %v", replica.Addr, master.Addr, time.Since(started).Round(time.Millisecond))
	time.Sleep(time.Second)
	cancel()
	l.stop(t)
	after := l.acquired.Load()
	assert.Greater(t, after, before, "acquisitions go on after the failover")
	t.Logf("failover: %d semaphores, %d acquisitions (%d after the failover began), pool stats %+v",
		len(sems), after, after-before, p.Stats())
	settled(t, p, redsem.DefaultPrefix, sems...)
}

// testWait measures the cost of WAIT and checks its promise: with WAIT an
// Acquire that returns a lease had its grant acknowledged by a replica; when
// no replica acknowledges, Acquire fails and no token is lost for longer than
// a TTL.
func testWait(t *testing.T, c *redistest.Cluster) {
	plain := newPool(t, c)
	waiting := newPool(t, c, cluster.WithWait(1, 200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const rounds = 300
	measure := func(p redsem.Pool, name string) (acq, rel time.Duration) {
		s, err := redsem.NewSemaphore(p, name, 1)
		require.NoError(t, err)
		var acqs, rels []time.Duration
		for i := 0; i < rounds; i++ {
			t0 := time.Now()
			l, err := s.Acquire(ctx)
			require.NoError(t, err)
			t1 := time.Now()
			require.NoError(t, l.Release(ctx))
			acqs, rels = append(acqs, t1.Sub(t0)), append(rels, time.Since(t1))
		}
		return median(acqs), median(rels)
	}
	pa, pr := measure(plain, "wait-cost")
	wa, wr := measure(waiting, "wait-cost")
	t.Logf("WAIT cost, median of %d uncontended pairs on loopback: acquire %v -> %v, release %v -> %v (without -> with WAIT 1 200ms)",
		rounds, pa, wa, pr, wr)

	// No replica acknowledges: stop the replica of the semaphore's master.
	s, err := redsem.NewSemaphore(waiting, "wait-stopped", 2, redsem.WithTTL(1500*time.Millisecond))
	require.NoError(t, err)
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	held, err := s.Acquire(ctx)
	require.NoError(t, err)
	replica := c.ReplicaOf(c.Node(waiting.MasterOf("{wait-stopped}")))
	require.NoError(t, replica.Signal(syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			_ = replica.Signal(syscall.SIGCONT)
		}
	}()
	_, err = s.Acquire(ctx)
	require.ErrorIs(t, err, cluster.ErrNotReplicated)
	_, err = s.TryAcquire(ctx)
	require.ErrorIs(t, err, cluster.ErrNotReplicated)
	// The release happened on the master but is not acknowledged.
	require.ErrorIs(t, held.Release(ctx), cluster.ErrNotReplicated)
	require.NoError(t, replica.Signal(syscall.SIGCONT))
	stopped = false
	c.WaitStable(10 * time.Second)
	// The unacknowledged grants stay leased on the master until their TTL:
	// then every token is free again, and never more than size holders.
	settled(t, waiting, redsem.DefaultPrefix, s)
}

func median(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// TestReclaimDuringMigration is the regression test of a library bug on
// Redis Cluster (see the package documentation, "Resharding"): a script that
// runs on the source of a migrating slot fails at its first access to a key that does not exist
// there, even one it emptied itself, and keeps its earlier writes. Here
// Reclaim removed an expired lease (the last one, so the leases key went),
// then failed giving its token back: the token was gone for good. The
// scripts now step aside (TRYAGAIN) on a migrating slot before their first
// write, and the cluster pool retries once the move is over.
func TestReclaimDuringMigration(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 2, 0)
	p := newPool(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := redsem.NewSemaphore(p, "repro", 2, redsem.WithTTL(300*time.Millisecond), redsem.WithFixedTTL(),
		redsem.WithGrace(100*time.Millisecond))
	require.NoError(t, err)
	l1, err := s.Acquire(ctx)
	require.NoError(t, err)
	l2, err := s.Acquire(ctx)
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.Acquire(wctx) // leaves a tombstone: the waits key exists
	wcancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, l2.Release(ctx))
	time.Sleep(400 * time.Millisecond) // l1 has expired, nobody reclaimed it
	_ = l1

	ops, err := admin.New(p, redsem.DefaultPrefix, s.Name())
	require.NoError(t, err)
	slot := slotOf(s)
	done := make(chan error, 1)
	_, err = c.MoveSlot(slot, otherMaster(t, c, c.Owner(slot)), func(round int) bool {
		if round == 0 { // MIGRATING, every key still on the source
			go func() {
				_, err := ops.Reclaim(ctx)
				done <- err
			}()
			time.Sleep(300 * time.Millisecond)
		}
		return false
	})
	require.NoError(t, err)
	assert.NoError(t, <-done)
	settled(t, p, redsem.DefaultPrefix, s)
}

// The fast paths of Release and Acquire (internal/engine/lua/release_fast.lua,
// internal/engine/lua/acquire_fast.lua) carry no probe for a migrating slot: Redis answers
// TRYAGAIN itself when some of a script's declared keys are missing on the
// source (here the token list, all tokens being out, and the fresh call's
// pending list), and the pool retries once the move is over. A release and
// a waiter during a migration both complete, and nothing is lost.
func TestReleaseAndAcquireDuringMigration(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 2, 0)
	p := newPool(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := redsem.NewSemaphore(p, "fastmove", 1, redsem.WithTTL(5*time.Second), redsem.WithFixedTTL())
	require.NoError(t, err)
	l, err := s.Acquire(ctx) // the token list is empty now: its key is gone
	require.NoError(t, err)

	slot := slotOf(s)
	released, acquired := make(chan error, 1), make(chan error, 1)
	_, err = c.MoveSlot(slot, otherMaster(t, c, c.Owner(slot)), func(round int) bool {
		if round == 0 { // MIGRATING, every key still on the source
			go func() { released <- l.Release(ctx) }()
			time.Sleep(300 * time.Millisecond)
			go func() {
				l2, err := s.Acquire(ctx)
				if err == nil {
					err = l2.Release(ctx)
				}
				acquired <- err
			}()
			time.Sleep(300 * time.Millisecond)
		}
		return false
	})
	require.NoError(t, err)
	assert.NoError(t, <-released, "Release during the migration")
	assert.NoError(t, <-acquired, "Acquire and Release during the migration")
	settled(t, p, redsem.DefaultPrefix, s)
}
