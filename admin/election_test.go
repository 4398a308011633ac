package admin

import (
	"context"
	"testing"
	"time"

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
