package redsem

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

// switchPool hands out connections of whichever pool it currently points at.
type switchPool struct{ cur atomic.Pointer[redis.Pool] }

func (p *switchPool) GetContext(ctx context.Context) (redis.Conn, error) {
	return p.cur.Load().GetContext(ctx)
}

// A release or refresh that reaches a replica (a master that a failover
// demoted, a connection a pool has not moved yet) where the lease is not
// recorded fails with Redis's READONLY error, which the Sentinel and
// cluster pools take as "the master moved": it does not report the lease
// lost while the master still records it. Without the probe the scripts
// find nothing to do, write nothing, and Redis runs them on the replica
// without a word.
func TestLease_Release_onAReplicaIsNotALostLease(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	empty := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(empty.Port))
	onMaster, onReplica := newPool(t, master.Addr), newPool(t, replica.Addr)
	ctx := ctxT(t, 20*time.Second)

	sp := &switchPool{}
	sp.cur.Store(onMaster)
	s, err := NewSemaphore(sp, "demoted", 3, WithFixedTTL(), WithTTL(time.Minute))
	require.NoError(t, err)
	rw, err := NewRWMutex(sp, "demoted-rw", WithFixedTTL(), WithTTL(time.Minute))
	require.NoError(t, err)
	one, err := s.Acquire(ctx)
	require.NoError(t, err)
	two, err := s.AcquireN(ctx, 2)
	require.NoError(t, err)
	w, err := rw.Lock(ctx)
	require.NoError(t, err)

	leases := map[string]*Lease{"single": one, "weighted": two, "rwmutex": w}
	sp.cur.Store(onReplica)
	for name, l := range leases {
		err := l.Refresh(ctx, time.Minute)
		require.Error(t, err, name)
		assert.NotErrorIs(t, err, ErrLeaseLost, name)
		assert.ErrorContains(t, err, "READONLY", name)
		assert.True(t, l.Valid(), "%s: still held", name)
	}
	sp.cur.Store(onMaster)
	for name, l := range leases {
		require.NoError(t, l.Refresh(ctx, time.Minute), name)
	}
	sp.cur.Store(onReplica)
	for name, l := range leases {
		err := l.Release(ctx)
		require.Error(t, err, name)
		assert.NotErrorIs(t, err, ErrLeaseLost, name)
		assert.ErrorContains(t, err, "READONLY", name)
		assert.True(t, l.Valid(), "%s: an error reply changed nothing", name)
	}
	sp.cur.Store(onMaster)
	for name, l := range leases {
		require.NoError(t, l.Release(ctx), name, "released on the master, which still recorded it")
		assert.ErrorIs(t, l.Err(), ErrReleased, name)
	}
	requireInventory(t, s, 3, 0)
	// On the master, a lease that is not recorded is still reported lost.
	l, err := s.Acquire(ctx)
	require.NoError(t, err)
	redistest.Do(t, master.Addr, "HDEL", s.k.holders, "t:"+l.Token())
	require.ErrorIs(t, l.Release(ctx), ErrLeaseLost)
}
