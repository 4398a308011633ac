package admin

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

// Delete removes every kind under the name, in use or not: the holders of
// the semaphore and of the lock lose their leases, the gate's window is
// empty again, and nothing of the three is left.
func TestHandle_Delete_everyKind(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const name = "shared"
		held := holdN(t, ctx, newSem(t, b, name, 2).TryAcquire, 1)[0]
		rw, err := redsem.NewRWMutex(b.pool, name)
		require.NoError(t, err)
		writer, err := rw.TryLock(ctx)
		require.NoError(t, err)
		g := newRateGate(t, b, name, 2, time.Hour)
		require.NoError(t, g.SetRate(ctx, 2, time.Hour))
		_, err = g.AllowN(ctx, 2)
		require.NoError(t, err)

		a, err := New(b.pool, redsem.DefaultPrefix, name)
		require.NoError(t, err)
		kinds, err := a.Kinds(ctx)
		require.NoError(t, err)
		require.Equal(t, []Kind{KindSemaphore, KindRWMutex, KindRate}, kinds)
		require.NoError(t, a.Delete(ctx))
		assert.Equal(t, 0, b.keyCount(t), "Delete removed every key of every kind")
		assert.ErrorIs(t, held.Release(context.Background()), redsem.ErrLeaseLost, "semaphore holder")
		assert.ErrorIs(t, writer.Release(context.Background()), redsem.ErrLeaseLost, "writer")
		_, err = g.AllowN(ctx, 2)
		assert.NoError(t, err, "the gate starts afresh, its window empty")
		require.NoError(t, a.Delete(ctx), "again")
		assert.Equal(t, 0, b.keyCount(t))
	})
}

// A key of another type than its layout's makes Delete fail and write
// nothing; Purge removes it.
func TestHandle_Delete_wrongTypeRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		g := newRateGate(t, b, "gate", 1, time.Hour)
		_, err := g.Allow(ctx)
		require.NoError(t, err)
		b.do(t, "SET", key(redsem.DefaultPrefix, "gate", "rate:queue"), "a stranger's")
		before := b.keyCount(t)
		a, err := New(b.pool, redsem.DefaultPrefix, "gate")
		require.NoError(t, err)
		err = a.Delete(ctx)
		require.ErrorIs(t, err, redsem.ErrWrongType)
		assert.Contains(t, err.Error(), "rate:queue holds a string, want a list")
		assert.Equal(t, before, b.keyCount(t), "a refused Delete writes nothing")
		_, err = a.Purge(ctx)
		require.NoError(t, err)
		assert.Equal(t, 0, b.keyCount(t))
		_, err = rate.ReadStatus(ctx, b.pool, redsem.DefaultPrefix, "gate")
		require.NoError(t, err)
	})
}
