package admin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// One fleet read on a large keyspace where few keys are redsem's sends at
// most DefaultMaxScan SCAN calls and one EVALSHA per name found, and says
// the scan was cut short; with a cap that covers the keyspace it walks it
// all and finds every name. Counted by the server (INFO commandstats).
func TestReadFleetBoundsTheScan(t *testing.T) {
	b := realRedis(t)
	ctx := ctxT(t, 60*time.Second)
	const prefix = "bound:"
	for _, name := range []string{"a", "b", "c"} {
		_, err := newSem(t, b, name, 2, redsem.WithPrefix(prefix), redsem.WithFixedTTL()).TryAcquire(ctx)
		require.NoError(t, err)
	}
	// 150,000 keys of another program: 300 SCAN calls of COUNT 500 to walk.
	b.do(t, "DEBUG", "POPULATE", 150000, "other")
	_, err := ReadFleet(ctx, b.pool, prefix, ScanLimits{Limit: 100}) // loads the status script
	require.NoError(t, err)

	b.do(t, "CONFIG", "RESETSTAT")
	fl, err := ReadFleet(ctx, b.pool, prefix, ScanLimits{Limit: 100})
	require.NoError(t, err)
	calls := b.srv.CommandCalls(t)
	assert.Equal(t, DefaultMaxScan, calls["scan"], "SCAN calls of one ReadFleet: %v", calls)
	assert.Equal(t, len(fl.Semaphores), calls["evalsha"], "one EVALSHA per name: %v", calls)
	assert.Zero(t, calls["eval"], "%v", calls)
	assert.True(t, fl.Truncated, "the cap cut the scan short")

	b.do(t, "CONFIG", "RESETSTAT")
	names, err := ScanNames(ctx, b.pool, prefix, ScanLimits{Limit: 100, MaxScan: 2000})
	require.NoError(t, err)
	calls = b.srv.CommandCalls(t)
	assert.False(t, names.Truncated, "a cap above the keyspace's walk")
	assert.Len(t, names.Found, 3)
	assert.Greater(t, calls["scan"], DefaultMaxScan, "walking 150,000 keys takes more than the default cap: %v", calls)
	assert.Less(t, calls["scan"], 2000, "%v", calls)

	b.do(t, "CONFIG", "RESETSTAT")
	names, err = ScanNames(ctx, b.pool, prefix, ScanLimits{Limit: 100, MaxScan: 7})
	require.NoError(t, err)
	assert.Equal(t, 7, b.srv.CommandCalls(t)["scan"])
	assert.True(t, names.Truncated)
}
