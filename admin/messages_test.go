package admin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// A held mutex's TryLock says the mutex is taken, not that a "semaphore"
// has no token, and still matches ErrNoToken. (Here rather than in the root
// package's tests, which another change owns.)
func TestHeldMutexTryLockMessage(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		mu, err := redsem.NewMutex(b.pool, "job", redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.NoError(t, err)
		_, err = mu.TryLock(ctx)
		require.ErrorIs(t, err, redsem.ErrNoToken)
		assert.EqualError(t, err, `redsem: no token free: every slot of "job" is taken`)
		assert.NotContains(t, err.Error(), "semaphore")
	})
}
