package cluster_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/cluster"
	"github.com/redsem/redsem/internal/redistest"
)

// testFleet: ScanNames scans every master, so semaphores spread over the
// cluster's slots are all found, and ReadFleet reads each through the
// routing pool.
func testFleet(t *testing.T, c *redistest.Cluster, p *cluster.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const prefix = "fleet:"
	owners := map[string]bool{}
	var sems []*redsem.Semaphore
	for i := 0; i < 24; i++ {
		name := "f" + strconv.Itoa(i)
		s, err := redsem.NewSemaphore(p, name, 2, redsem.WithPrefix(prefix), redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.NoError(t, err)
		sems = append(sems, s)
		owners[p.MasterOf(prefix+"{"+name+"}:meta")] = true
	}
	require.Greater(t, len(owners), 1, "the names must spread over several masters")

	names, err := admin.ScanNames(ctx, p, prefix, admin.ScanLimits{Limit: 100})
	require.NoError(t, err)
	assert.Len(t, names.Found, 24)
	assert.False(t, names.Truncated)

	names, err = admin.ScanNames(ctx, p, prefix, admin.ScanLimits{Limit: 10})
	require.NoError(t, err)
	assert.Len(t, names.Found, 10)
	assert.True(t, names.Truncated)

	fl, err := admin.ReadFleet(ctx, p, prefix, admin.ScanLimits{Limit: 100})
	require.NoError(t, err)
	require.Len(t, fl.Semaphores, 24)
	for _, st := range fl.Semaphores {
		assert.Len(t, st.Holders, 1, st.Name)
		assert.Equal(t, 1, st.Available, st.Name)
	}
	for _, s := range sems {
		ops, err := admin.New(p, prefix, s.Name())
		require.NoError(t, err)
		require.NoError(t, ops.Delete(ctx))
	}
}
