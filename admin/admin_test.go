package admin

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// A Handle works on the size stored in Redis without being told one: every
// operation on a semaphore of size 3 with a holder, made by a client that
// knows the size, and nothing written by New.
func TestHandleNeedsNoSize(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const prefix = "ops:"
		for _, c := range []struct {
			pool   Pool
			prefix string
			name   string
			want   error
		}{
			{nil, prefix, "jobs", redsem.ErrInvalidOption},
			{b.pool, "a{b", "jobs", redsem.ErrInvalidOption},
			{b.pool, prefix, "", redsem.ErrInvalidName},
		} {
			a, err := New(c.pool, c.prefix, c.name)
			require.ErrorIs(t, err, c.want, "%q %q", c.prefix, c.name)
			assert.Nil(t, a)
		}
		a, err := New(b.pool, prefix, "jobs")
		require.NoError(t, err)
		assert.Equal(t, "jobs", a.Name())
		assert.Equal(t, 0, b.keyCount(t), "New writes nothing")
		st, err := a.Status(ctx)
		require.NoError(t, err)
		assert.False(t, st.Exists)

		s := newSem(t, b, "jobs", 3, redsem.WithPrefix(prefix), redsem.WithFixedTTL(), redsem.WithTTL(time.Minute))
		held := holdN(t, ctx, s.TryAcquire, 2)
		st, err = a.Status(ctx)
		require.NoError(t, err)
		assert.True(t, st.Exists)
		assert.Equal(t, 3, st.Size)
		assert.Equal(t, 1, st.Available)
		assert.Len(t, st.Holders, 2)

		inv, err := a.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.Equal(t, 3, inv.Size)

		require.NoError(t, a.Resize(ctx, 5))
		st, err = a.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 5, st.Size)
		assert.Equal(t, 3, st.Available)

		// An expired lease is reclaimed; Repair finds nothing else to do.
		b.do(t, "ZADD", key(prefix, "jobs", "leases"), "XX", time.Now().Add(-time.Minute).UnixMilli(), held[0].Token())
		n, err := a.Reclaim(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		rep, err := a.Repair(ctx)
		require.NoError(t, err)
		assert.Zero(t, rep.Reclaimed)
		assert.Empty(t, rep.Minted)

		require.NoError(t, a.Delete(ctx))
		assert.Equal(t, 0, b.keyCount(t), "Delete removed every key")
		assert.ErrorIs(t, held[1].Release(context.Background()), redsem.ErrLeaseLost)
	})
}
