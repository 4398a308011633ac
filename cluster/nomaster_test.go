package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/redistest"
)

// A slot map with no master for a slot, as a refresh may catch in the
// middle of a failover, makes a command wait and ask again rather than
// fail at once: here the map is blanked for the slot just after a refresh,
// so the next one comes only after the minimum gap.
func TestNoMasterForAMoment(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := New(ctx, c.Addrs())
	require.NoError(t, err)
	defer p.Close()
	key := "{moment}:k"
	p.refreshMu.Lock()
	p.mu.Lock()
	p.slots[Slot(key)] = ""
	p.mu.Unlock()
	p.lastRefresh = time.Now()
	p.refreshMu.Unlock()

	conn, err := p.GetContext(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = redis.DoContext(conn, ctx, "SET", key, "v")
	require.NoError(t, err, "answered once the next refresh found the master")
}
