package redsem

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// Faults an election meets, each after a peer's bug: etcd #21128 (an
// election not resigned when Campaign fails), #18163 (Observe reports a
// stale leader after a network gap), PR #22387 (campaigners keep waiting on
// a session that expired), Curator CURATOR-460 (two leaders at once).

// namedPool dials connections named name, so a test can kill them.
func namedPool(t *testing.T, b *backend, name string) *redis.Pool {
	p := &redis.Pool{MaxIdle: 8, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", b.addr, redis.DialClientName(name))
	}}
	t.Cleanup(func() { p.Close() })
	return p
}

// clients lists the connections named name: id -> the command they run.
func clients(t *testing.T, b *backend, name string) map[string]string {
	info, err := redis.String(b.do(t, "CLIENT", "LIST"), nil)
	require.NoError(t, err)
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if name != "" && !strings.Contains(line, " name="+name+" ") {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
		_, cmd, _ := strings.Cut(line, " cmd=")
		cmd, _, _ = strings.Cut(cmd, " ")
		out[id] = cmd
	}
	return out
}

// blockedIn waits until a connection named name is blocked in cmd, and
// kills every connection named name if kill is set.
func blockedIn(t *testing.T, b *backend, name, cmd string, kill bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, c := range clients(t, b, name) {
			if c == cmd {
				return true
			}
		}
		return false
	}, 20*time.Second, time.Millisecond, "%s never blocked in %s: %v", name, cmd, clients(t, b, ""))
	if kill {
		for id := range clients(t, b, name) {
			b.do(t, "CLIENT", "KILL", "ID", id)
		}
	}
}

// etcd #21128: a Campaign that fails once it was granted (here every
// reply to its claim is lost, though Redis ran it) resigns before it
// returns: an observer learns "no leader" at once, nobody is reported as
// leading, and the seat is free. The lease's TTL and the observer's block
// are an hour, so "no leader" cannot come from the lease's expiry or a
// re-read: only the resign rings the observer.
func TestElection_failedCampaignResigns(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	lossy := &hookPool{Pool: b.pool, AfterDo: func(cmd string, args []interface{}) error {
		if isScript(engine.Election.Script, cmd, args) && len(args) > 8 && args[8] == "claim" {
			return errLostReply
		}
		return nil
	}}
	// Redis knows the script before the claim whose reply is lost: a lost
	// NOSCRIPT would leave no claim to resign.
	b.do(t, "SCRIPT", "LOAD", engine.Election.Src())
	watcher := newElection(t, b.pool, "failed")
	watcher.s.maxBlock.Store(int64(time.Hour))
	o := observe(t, watcher)
	assert.Equal(t, []Leader{none()}, o.waitFor(t, 1))
	e := newElection(t, lossy, "failed", WithTTL(time.Hour))
	_, err := e.Campaign(ctx, "lost")
	require.ErrorIs(t, err, errLostReply)
	seen := o.waitFor(t, 3)
	require.Len(t, seen, 3, "the claim ran, then the resign")
	assert.Equal(t, "lost", seen[1].Value)
	assert.NotZero(t, seen[1].Term)
	assert.Equal(t, none(), seen[2], "the observer learns that the failed campaign leads no more")
	got, err := e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, none(), got, "the failed campaign is not reported as leading")
	l, err := newElection(t, b.pool, "failed").s.TryAcquire(ctx)
	require.NoError(t, err, "the seat is free")
	require.NoError(t, l.Release(ctx))
}

// etcd #18163: an observer cut off from Redis while the leader changes
// never reports the old leader as current once it is back: it reports the
// changes it missed, in order, each once, and ends on the current leader.
func TestElection_observeAfterGap(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	var cut atomic.Bool
	gapped := &hookPool{Pool: namedPool(t, b, "observer"), BeforeDo: func(string, []interface{}) error {
		if cut.Load() {
			return errors.New("test: network down")
		}
		return nil
	}}
	e := newElection(t, b.pool, "gap")
	a, err := e.Campaign(ctx, "a")
	require.NoError(t, err)
	o := observe(t, newElection(t, gapped, "gap"))
	assert.Equal(t, []Leader{leader(a, "a")}, o.waitFor(t, 1))

	blockedIn(t, b, "observer", "blpop", false)
	cut.Store(true)
	blockedIn(t, b, "observer", "blpop", true)
	require.NoError(t, a.Resign(ctx))
	c, err := e.Campaign(ctx, "c")
	require.NoError(t, err)
	require.NoError(t, c.Proclaim(ctx, "c2"))
	cut.Store(false)

	want := []Leader{leader(a, "a"), none(), leader(c, "c"), leader(c, "c2")}
	assert.Equal(t, want, o.waitFor(t, len(want)))
	cur, err := e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, leader(c, "c2"), cur)
	require.NoError(t, c.Resign(ctx))
}

// PR #22387: a campaigner and an observer whose connections are killed
// again and again while they wait (CLIENT KILL) register again: the
// campaigner leads as soon as the seat is free, and the observer reports
// every change once.
func TestElection_killedCampaignerAndObserver(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	e := newElection(t, b.pool, "killed")
	a, err := e.Campaign(ctx, "a")
	require.NoError(t, err)
	o := observe(t, newElection(t, namedPool(t, b, "observer"), "killed"))
	o.waitFor(t, 1)
	won := make(chan *Leadership, 1)
	go func() {
		l, err := newElection(t, namedPool(t, b, "campaigner"), "killed").Campaign(ctx, "c")
		if err != nil {
			close(won)
			return
		}
		won <- l
	}()
	for i := 0; i < 3; i++ {
		blockedIn(t, b, "campaigner", "blmove", true)
		blockedIn(t, b, "observer", "blpop", true)
	}
	blockedIn(t, b, "campaigner", "blmove", false)
	require.NoError(t, a.Resign(ctx))
	c := <-won
	require.NotNil(t, c, "the campaigner led")
	require.Greater(t, c.Term(), a.Term())
	want := []Leader{leader(a, "a"), none(), leader(c, "c")}
	assert.Equal(t, want, o.waitFor(t, len(want)))
	require.NoError(t, c.Resign(ctx))
}

// CURATOR-460: a leader cut off from Redis (every command fails, as in a
// partition) has seen its Context end by the time another campaigner leads,
// and a fenced resource refuses its term once the new leader's was used.
// Observers learn that nobody leads within one TTL, with no campaign to tell
// them.
func TestElection_cutOffLeaderEndsBeforeTheNextLeads(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	const ttl = 300 * time.Millisecond
	var cut atomic.Bool
	partitioned := &hookPool{Pool: b.pool, BeforeDo: func(string, []interface{}) error {
		if cut.Load() {
			return errors.New("test: partitioned")
		}
		return nil
	}}
	o := observe(t, newElection(t, b.pool, "cut"))
	o.waitFor(t, 1)
	a, err := newElection(t, partitioned, "cut", WithTTL(ttl)).Campaign(ctx, "a")
	require.NoError(t, err)
	fence := fencedResource{}
	require.True(t, fence.write(a.Term()))
	cut.Store(true)
	assert.Equal(t, []Leader{none(), leader(a, "a"), none()}, o.waitFor(t, 3), "the observer noticed by itself")

	c, err := newElection(t, b.pool, "cut", WithTTL(ttl)).Campaign(ctx, "c")
	require.NoError(t, err)
	require.Error(t, a.Context().Err(), "the old leader's context ended before the new one led")
	require.False(t, a.Valid())
	require.True(t, fence.write(c.Term()))
	assert.False(t, fence.write(a.Term()), "the resource refuses the old term")
	cut.Store(false)
	assert.ErrorIs(t, a.Proclaim(ctx, "still me?"), ErrLeaseExpired)
	assert.Equal(t, []Leader{none(), leader(a, "a"), none(), leader(c, "c")}, o.waitFor(t, 4))
	require.NoError(t, c.Resign(ctx))
}

// fencedResource accepts a write only with a term at least the highest seen.
type fencedResource struct{ max int64 }

func (f *fencedResource) write(term int64) bool {
	if term < f.max {
		return false
	}
	f.max = term
	return true
}

// A Redis restart without persistence loses the election: the leader's
// context ends, observers report that nobody leads, and the next leader's
// term is above the lost one's.
func TestElection_redisRestart(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	const ttl = 500 * time.Millisecond
	e := newElection(t, b.pool, "restart", WithTTL(ttl))
	a, err := e.Campaign(ctx, "a")
	require.NoError(t, err)
	o := observe(t, e)
	o.waitFor(t, 1)
	b.srv.Restart()
	select {
	case <-a.Context().Done():
	case <-ctx.Done():
		t.Fatal("the leader's context never ended")
	}
	assert.Equal(t, []Leader{leader(a, "a"), none()}, o.waitFor(t, 2))
	c, err := e.Campaign(ctx, "c")
	require.NoError(t, err)
	assert.Greater(t, c.Term(), a.Term())
	assert.Equal(t, []Leader{leader(a, "a"), none(), leader(c, "c")}, o.waitFor(t, 3))
	require.NoError(t, c.Resign(ctx))
}

// Nobody polls: with a leader, a campaigner and an observer waiting, Redis
// runs no command until something changes.
func TestElection_idleWaitersSendNothing(t *testing.T) {
	t.Parallel()
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	e := newElection(t, b.pool, "idle")
	a, err := e.Campaign(ctx, "a")
	require.NoError(t, err)
	o := observe(t, newElection(t, namedPool(t, b, "observer"), "idle"))
	o.waitFor(t, 1)
	won := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) {
		l, err := newElection(t, namedPool(t, b, "campaigner"), "idle").Campaign(ctx, "c")
		if err != nil {
			return nil, err
		}
		return l.lease, nil
	})
	blockedIn(t, b, "campaigner", "blmove", false)
	blockedIn(t, b, "observer", "blpop", false)
	b.do(t, "CONFIG", "RESETSTAT")
	time.Sleep(time.Second)
	calls := b.srv.CommandCalls(t)
	delete(calls, "config|resetstat")
	delete(calls, "info")
	assert.Empty(t, calls, "commands while nothing changed")
	require.NoError(t, a.Resign(ctx))
	l := <-won
	require.NotNil(t, l)
	require.NoError(t, l.Release(ctx))
}
