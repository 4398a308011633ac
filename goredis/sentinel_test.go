package goredis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/behaviour"
	"github.com/redsem/redsem/internal/redistest"
)

// newFailoverClient returns a Sentinel failover client of set's master.
func newFailoverClient(t *testing.T, set *redistest.Sentinels) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    redistest.SentinelName,
		SentinelAddrs: set.Addrs(),
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBehaviourFailover holds a Sentinel failover client
// (redis.NewFailoverClient) to the suite: it finds the master through the
// sentinel and is used as any *redis.Client.
func TestBehaviourFailover(t *testing.T) {
	set := redistest.StartSentinels(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	behaviour.Run(t, behaviour.Target{Pool: newPool(t, newFailoverClient(t, set))})
}

// TestFailoverSwitch: after Sentinel promotes the replica, the failover
// client's pool serves redsem from the new master: the lease taken before
// the switch (replicated) is released there, and new acquisitions work.
func TestFailoverSwitch(t *testing.T) {
	t.Parallel() // mostly waits for Sentinel
	set := redistest.StartSentinels(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newFailoverClient(t, set)
	// A fixed lease, long enough for a slow failover: this test is about
	// where the release goes. An auto-refresh that lands in Sentinel's
	// window of split brain may be applied to the old master only, or read
	// a demoted one: what a failover may lose is docs/sentinel.md's and the
	// fault suite's business (TestSentinelKillMaster), not this test's.
	pool := newPool(t, c)
	sem, err := redsem.NewSemaphore(pool, "switch", 2, redsem.WithFixedTTL(), redsem.WithTTL(2*time.Minute))
	require.NoError(t, err)
	held, err := sem.Acquire(ctx)
	require.NoError(t, err)
	// The replica has every write before the switch.
	require.NoError(t, set.WaitSynced(set.Master(), 30*time.Second))

	// The sentinel answers NOGOODSLAVE until it has fresh word of the
	// replica (its INFO is polled every few seconds): ask again.
	var promoted *redistest.Server
	behaviour.WaitFor(t, 45*time.Second, "sentinel failover", func() bool {
		var err error
		if promoted, _, err = set.Failover(30 * time.Second); err != nil {
			t.Logf("failover: %v", err)
			time.Sleep(200 * time.Millisecond)
		}
		return err == nil
	})
	// Until the old master has turned replica and the client has moved,
	// both answer as masters (Sentinel's window of split brain, where
	// writes to the old one are lost): wait that out, then release.
	require.NoError(t, set.WaitReplicas(promoted, 1, 30*time.Second))
	behaviour.WaitFor(t, 30*time.Second, "client on the promoted master", func() bool {
		port, err := c.ConfigGet(ctx, "port").Result()
		return err == nil && port["port"] == strconv.Itoa(promoted.Port)
	})
	require.NoError(t, held.Release(ctx), "the lease taken before the switch is released on the promoted master")
	l, err := sem.Acquire(ctx)
	require.NoError(t, err)
	ops, err := admin.New(pool, redsem.DefaultPrefix, "switch")
	require.NoError(t, err)
	inv, err := ops.Check(ctx)
	require.NoError(t, err)
	assert.True(t, inv.Healthy(), "%+v", inv)
	assert.Equal(t, []string{l.Token()}, inv.Leased)
	leases, err := redigo.Int(set.Do(promoted, "ZCARD", redsem.DefaultPrefix+"{switch}:leases"))
	require.NoError(t, err)
	assert.Equal(t, 1, leases, "the lease is recorded on the promoted master")
	require.NoError(t, l.Release(ctx))
}
