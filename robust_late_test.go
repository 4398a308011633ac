package redsem

import (
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/redsem/redsem/internal/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lateWaiter registers a waiter whose pending list a Reclaim then sweeps
// before its BLMOVE arrives: the case the explorer found (seed 297). The
// holder's short lease caps the waiter's block, so the sweep is due soon;
// it returns the waiter's acquisition id once the sweep ran.
func lateWaiter(t *testing.T, b *backend, s *Semaphore) string {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	_, err := s.TryAcquire(ctx) // never released: it expires, and the sweep gives its token back too
	require.NoError(t, err)
	_, reg, err := s.acquire(ctx, engine.ModeRegister, nil)
	require.NoError(t, err)
	require.NotNil(t, reg)
	require.Eventually(t, func() bool {
		_, err := s.Reclaim(ctx)
		require.NoError(t, err)
		n, err := redis.Int(b.do(t, "ZCARD", s.k.leases), nil)
		require.NoError(t, err)
		return n == 0 && b.do(t, "ZSCORE", s.k.waits, "w:"+reg.Acq) == nil
	}, 10*time.Second, 20*time.Millisecond, "the lease and the waiter's registration were never swept")
	return reg.Acq
}

func TestSemaphore_Acquire_sweptWaiterLeavesATombstone(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		s := newSem(t, b, "late-tomb", 1, WithTTL(300*time.Millisecond), WithGrace(0), WithFixedTTL())
		acq := lateWaiter(t, b, s)
		score, err := redis.Int64(b.do(t, "ZSCORE", s.k.waits, "x:"+acq), nil)
		require.NoError(t, err, "a swept registration must leave a tombstone for a late BLMOVE")
		now, err := redis.Int64s(b.do(t, "TIME"), nil)
		require.NoError(t, err)
		nowMs := now[0]*1000 + now[1]/1000
		assert.InDelta(t, nowMs+60000, score, 5000, "the tombstone lasts LATE_MS")
		exp, err := redis.String(b.do(t, "HGET", s.k.meta, "x:"+acq), nil)
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatInt(score, 10), exp)
	})
}

// A late BLMOVE followed by its lease script: the script sees the
// tombstone, gives the token back and grants nothing.
func TestSemaphore_Acquire_lateWaitScriptGrantsNothing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "late-script", 1, WithTTL(300*time.Millisecond), WithGrace(0), WithFixedTTL())
		acq := lateWaiter(t, b, s)
		conn, err := b.pool.GetContext(ctx)
		require.NoError(t, err)
		defer conn.Close()
		tok, err := redis.String(conn.Do("BLMOVE", s.k.tokens, s.k.pend(acq), "LEFT", "RIGHT", "1"))
		require.NoError(t, err, "the token is free, so the late BLMOVE is served at once")
		r, err := parseAcquireReply(engine.RunScript(ctx, conn, s.acquireCall(acq, time.Second, "wait")))
		require.NoError(t, err)
		assert.Equal(t, int64(2), r.Code, "a late lease script behind a swept registration granted %v", r.Tokens)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, st.Available, "token %s went back", tok)
		assert.Empty(t, st.Holders)
	})
}

// A late BLMOVE whose process died before its script: the token waits in
// the pending list until the tombstone's sweep, then comes back. It moves
// Redis TIME by a minute, so it runs on miniredis (the tombstone's presence
// and life on a real redis-server are checked above).
func TestSemaphore_Acquire_lateBlmoveTokenComesBack(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
	{
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "late-blmove", 1, WithTTL(300*time.Millisecond), WithGrace(0), WithFixedTTL())
		acq := lateWaiter(t, b, s)
		_, err := redis.String(b.do(t, "BLMOVE", s.k.tokens, s.k.pend(acq), "LEFT", "RIGHT", "1"), nil)
		require.NoError(t, err)
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, 0, st.Available, "the token sits in the late waiter's pending list")

		b.mini.SetTime(time.Now().Add(61 * time.Second))
		n, err := s.Reclaim(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "the tombstone's sweep gives the token back")
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.Len(t, inv.Free, 1)
	}
}
