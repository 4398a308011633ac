package goredis_test

import (
	"context"
	"testing"
	"time"

	redigo "github.com/gomodule/redigo/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/cluster"
	"github.com/redsem/redsem/internal/behaviour"
	"github.com/redsem/redsem/internal/redistest"
)

func otherMaster(t *testing.T, c *redistest.Cluster, not *redistest.Server) *redistest.Server {
	for _, m := range c.Masters() {
		if m != not {
			return m
		}
	}
	t.Fatal("no other master")
	return nil
}

// TestClusterRedirects: on a ClusterClient, a command follows MOVED and
// ASK after a slot moved behind the client's back, and an Acquire blocked
// on the old owner when its slot moves waits again on the new one and is
// served there.
func TestClusterRedirects(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaintNotificationsConfig: noMaint()})
	t.Cleanup(func() { rc.Close() })
	p := newPool(t, rc)
	conn := p.Get()
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// MOVED.
	key := "route:moved"
	do(t, conn, "SET", key, "v")
	slot := cluster.Slot(key)
	_, err := cl.MoveSlot(slot, otherMaster(t, cl, cl.Owner(slot)), nil)
	require.NoError(t, err)
	v, err := redigo.String(conn.Do("GET", key))
	require.NoError(t, err)
	assert.Equal(t, "v", v)

	// ASK: the key has moved, the slot is still migrating.
	key = "route:ask"
	do(t, conn, "SET", key, "w")
	slot = cluster.Slot(key)
	_, err = cl.MoveSlot(slot, otherMaster(t, cl, cl.Owner(slot)), func(round int) bool {
		if round == 1 {
			v, err := redigo.String(conn.Do("GET", key))
			assert.NoError(t, err)
			assert.Equal(t, "w", v)
		}
		return round < 1
	})
	require.NoError(t, err)
	cl.WaitStable(10 * time.Second)

	// A blocked waiter whose slot moves.
	sem, err := redsem.NewSemaphore(p, "moving", 1)
	require.NoError(t, err)
	held, err := sem.Acquire(ctx)
	require.NoError(t, err)
	waiter, err := redsem.NewSemaphore(p, "moving", 1, redsem.WithWaitConnections(0))
	require.NoError(t, err)
	type grant struct {
		l   *redsem.Lease
		err error
	}
	got := make(chan grant, 1)
	go func() {
		l, err := waiter.Acquire(ctx)
		got <- grant{l, err}
	}()
	key = redsem.DefaultPrefix + "{moving}:tokens"
	src := cl.Owner(cluster.Slot(key))
	behaviour.WaitFor(t, 10*time.Second, "waiter blocked", func() bool {
		info, err := redigo.String(src.Do(t, "INFO", "clients"), nil)
		return err == nil && behaviour.BlockedClients(info) == 1
	})
	_, err = cl.MoveSlot(cluster.Slot(key), otherMaster(t, cl, src), nil)
	require.NoError(t, err)
	require.NoError(t, held.Release(ctx))
	var g grant
	select {
	case g = <-got:
	case <-ctx.Done():
		t.Fatal("waiter not served after its slot moved")
	}
	require.NoError(t, g.err)
	ops, err := admin.New(p, redsem.DefaultPrefix, "moving")
	require.NoError(t, err)
	inv, err := ops.Check(ctx)
	require.NoError(t, err)
	assert.True(t, inv.Healthy(), "%+v", inv)
	assert.Equal(t, []string{g.l.Token()}, inv.Leased)
	require.NoError(t, g.l.Release(ctx))
}
