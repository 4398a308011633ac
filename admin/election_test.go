package admin

import (
	"context"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// ElectionStatus and ReadFleet show an election's leader (its term, label
// and value), its waiting campaigners and its observers, and nobody leading
// once the leader resigned.
func TestElectionStatus(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		h, err := New(b.pool, redsem.DefaultPrefix, "sched")
		require.NoError(t, err)
		st, err := h.ElectionStatus(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)

		el, err := redsem.NewElection(b.pool, "sched", redsem.WithLabel("host-a"))
		require.NoError(t, err)
		lead, err := el.Campaign(ctx, "a")
		require.NoError(t, err)
		octx, stop := context.WithCancel(ctx)
		observed := make(chan error, 1)
		seen := make(chan redsem.Leader, 8)
		go func() { observed <- el.Observe(octx, func(l redsem.Leader) { seen <- l }) }()
		<-seen
		other, err := redsem.NewElection(b.pool, "sched", redsem.WithWaitConnections(0))
		require.NoError(t, err)
		wctx, wcancel := context.WithCancel(ctx)
		campaigned := make(chan error, 1)
		go func() { _, err := other.Campaign(wctx, "b"); campaigned <- err }()
		require.Eventually(t, func() bool {
			st, err = h.ElectionStatus(ctx)
			return err == nil && st.Waiting == 1
		}, 10*time.Second, time.Millisecond)
		require.NotNil(t, st.Leader)
		assert.Equal(t, lead.Term(), st.Leader.Fence)
		assert.Equal(t, "host-a", st.Leader.Label)
		assert.Equal(t, "a", st.Value)
		assert.Equal(t, 1, st.Observers)
		fl, err := ReadFleet(ctx, b.pool, redsem.DefaultPrefix, ScanLimits{})
		require.NoError(t, err)
		require.Len(t, fl.Elections, 1)
		assert.Equal(t, st.Value, fl.Elections[0].Value)
		assert.Empty(t, fl.Semaphores, "the election's mutex is no semaphore of the fleet")

		wcancel()
		require.ErrorIs(t, <-campaigned, context.Canceled)
		require.NoError(t, lead.Resign(ctx))
		stop()
		require.ErrorIs(t, <-observed, context.Canceled)
		st, err = h.ElectionStatus(ctx)
		require.NoError(t, err)
		assert.True(t, st.Exists)
		assert.Nil(t, st.Leader)
		assert.Equal(t, "", st.Value)
		assert.Zero(t, st.Waiting)
	})
}

// An election's keys (its mutex's, its leader record and log, its
// observers and their doorbells) are the name's: Kinds names the election,
// Keys lists every one of them, Delete removes them (the leader loses, a
// waiting campaigner leads the election made afresh, with a greater term,
// and an observer reports it next), and Purge removes them when a key has
// another type.
func TestElection_kindsKeysDeletePurge(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 30*time.Second)
		const p, name = redsem.DefaultPrefix, "sched"
		el, err := redsem.NewElection(b.pool, name, redsem.WithTTL(time.Second))
		require.NoError(t, err)
		lead, err := el.Campaign(ctx, "a")
		require.NoError(t, err)
		octx, stop := context.WithCancel(ctx)
		defer stop()
		seen := make(chan redsem.Leader, 16)
		observed := make(chan error, 1)
		go func() { observed <- el.Observe(octx, func(l redsem.Leader) { seen <- l }) }()
		require.Equal(t, "a", (<-seen).Value)
		other, err := redsem.NewElection(b.pool, name, redsem.WithTTL(time.Second), redsem.WithWaitConnections(0))
		require.NoError(t, err)
		campaigned := make(chan *redsem.Leadership, 1)
		go func() {
			l, err := other.Campaign(ctx, "b")
			assert.NoError(t, err)
			campaigned <- l
		}()
		h, err := New(b.pool, p, name)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			st, err := h.ElectionStatus(ctx)
			return err == nil && st.Waiting == 1 && st.Observers == 1
		}, 10*time.Second, time.Millisecond)
		// The doorbell of an observer that died after it was rung.
		b.do(t, "ZADD", key(p, name, "el:observers"), time.Now().Add(time.Hour).UnixMilli(), "deadobserver0001")
		b.do(t, "RPUSH", key(p, name, "el:ob:deadobserver0001"), "1")

		kinds, err := h.Kinds(ctx)
		require.NoError(t, err)
		assert.Equal(t, []Kind{KindElection}, kinds)
		keys, err := h.Keys(ctx)
		require.NoError(t, err)
		all, err := redis.Strings(b.do(t, "KEYS", "*"), nil)
		require.NoError(t, err)
		var listed []string
		for _, k := range keys {
			assert.Equal(t, KindElection, k.Kind, k.Key)
			listed = append(listed, k.Key)
		}
		assert.ElementsMatch(t, all, listed, "Keys lists every key the election wrote")
		for _, suffix := range []string{"el:meta", "el:leases", "el:holders", "el:waits", "el:leader", "el:log", "el:observers", "el:ob:deadobserver0001"} {
			assert.Contains(t, listed, key(p, name, suffix))
		}

		require.NoError(t, h.Delete(ctx))
		assert.NotContains(t, keysOf(t, b), key(p, name, "el:leader"))
		select {
		case <-lead.Context().Done():
		case <-time.After(20 * time.Second):
			t.Fatal("the leader did not lose its leadership after Delete")
		}
		var next *redsem.Leadership
		select {
		case next = <-campaigned:
		case <-time.After(20 * time.Second):
			t.Fatal("the waiting campaigner did not lead the election made afresh")
		}
		require.NotNil(t, next)
		assert.Greater(t, next.Term(), lead.Term())
		// Nobody leads, or b already does, at the observer's next read:
		// the changes of the deleted record are gone with it.
		waitLeader(t, seen, func(l redsem.Leader) bool { return l.Value == "b" }, "the observer to see b lead")
		require.NoError(t, next.Resign(ctx))
		stop()
		require.ErrorIs(t, <-observed, context.Canceled)

		// A key of another type: Delete refuses and writes nothing, Purge
		// removes every key of the election.
		b.do(t, "SET", key(p, name, "el:log"), "a stranger's")
		before := b.keyCount(t)
		require.ErrorIs(t, h.Delete(ctx), redsem.ErrWrongType)
		assert.Equal(t, before, b.keyCount(t))
		gone, err := h.Purge(ctx)
		require.NoError(t, err)
		assert.Len(t, gone, before)
		assert.Equal(t, 0, b.keyCount(t))
		st, err := h.ElectionStatus(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)
	})
}

// waitLeader reads seen until ok holds for a change, within a generous
// ceiling.
func waitLeader(t *testing.T, seen <-chan redsem.Leader, ok func(redsem.Leader) bool, what string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l := <-seen:
			if ok(l) {
				return
			}
		case <-deadline:
			t.Fatal("timed out waiting for " + what)
		}
	}
}

func keysOf(t *testing.T, b *backend) []string {
	all, err := redis.Strings(b.do(t, "KEYS", "*"), nil)
	require.NoError(t, err)
	return all
}
