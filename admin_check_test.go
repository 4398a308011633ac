package redsem

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
)

// pendID is the acquisition id of a waiter the tests fake by hand: a token
// moved into its pending list, its script not yet run.
const pendID = "0123456789abcdef0123456789abcdef"

// fakePending moves the token at the head of the list into pendID's pending
// list and registers the waiter, as a BLMOVE whose script has not run yet
// leaves them. It returns the token.
func fakePending(t *testing.T, b *backend, s *Semaphore) string {
	t.Helper()
	tok, err := redis.String(b.do(t, "LMOVE", s.k.tokens, s.k.pend(pendID), "LEFT", "RIGHT"), nil)
	require.NoError(t, err)
	b.do(t, "ZADD", s.k.waits, time.Now().Add(time.Minute).UnixMilli(), "w:"+pendID)
	return tok
}

// unfakePending puts the token back and removes the fake waiter.
func unfakePending(t *testing.T, b *backend, s *Semaphore) {
	t.Helper()
	b.do(t, "LMOVE", s.k.pend(pendID), s.k.tokens, "LEFT", "LEFT")
	b.do(t, "ZREM", s.k.waits, "w:"+pendID)
}

func TestHandle_Check_reportsInventory(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "check", 4)
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.False(t, inv.Exists)
		assert.True(t, inv.Healthy(), "nothing there is nothing wrong")
		assert.Equal(t, 0, b.keyCount(t), "Check writes nothing")

		held, err := s.TryAcquire(ctx) // slot 1; the list is now 2, 3, 4
		require.NoError(t, err)
		inFlight := fakePending(t, b, s) // slot 2
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		e := inv.Epoch
		assert.True(t, inv.Exists)
		assert.Equal(t, 4, inv.Size)
		assert.Equal(t, []string{held.Token()}, inv.Leased)
		assert.Equal(t, []string{inFlight}, inv.Pending)
		assert.Equal(t, []string{e + ":3", e + ":4"}, inv.Free)
		assert.Empty(t, inv.Duplicates)
		assert.Empty(t, inv.Strangers)
		assert.Empty(t, inv.Missing)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.WithinDuration(t, time.Now(), inv.ServerTime, 5*time.Second)

		// Sabotage: take a token away, push junk, and push copies of a free,
		// a leased and a pending token.
		b.do(t, "LPOP", s.k.tokens) // slot 3
		junk := []string{"garbage", "000000000000:1", e + ":5", e + ":01", e + ":0"}
		dups := []string{e + ":4", held.Token(), inFlight}
		for _, tok := range append(junk, dups...) {
			b.do(t, "LPUSH", s.k.tokens, tok)
		}
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.ElementsMatch(t, junk, inv.Strangers)
		assert.ElementsMatch(t, dups, inv.Duplicates)
		assert.Equal(t, []int{3}, inv.Missing)
		assert.Equal(t, []string{e + ":4"}, inv.Free)
		assert.False(t, inv.Healthy())

		unfakePending(t, b, s)
		require.NoError(t, held.Release(ctx))
	})
}

func TestHandle_Check_refusesWrongTypes(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "check-types", 2)
		b.do(t, "SET", s.k.waits, "x")
		_, err := s.Check(ctx)
		require.ErrorIs(t, err, ErrWrongType)
		_, err = s.Repair(ctx)
		require.ErrorIs(t, err, ErrWrongType)
		b.do(t, "DEL", s.k.waits)
		b.do(t, "HSET", s.k.meta, "size", "many")
		_, err = s.Check(ctx)
		require.ErrorIs(t, err, ErrCorrupt)
		b.do(t, "DEL", s.k.meta)
		b.do(t, "RPUSH", s.k.tokens, "left-over")
		_, err = s.Repair(ctx)
		require.ErrorIs(t, err, ErrCorrupt, "tokens without meta: nothing to repair by")
	})
}

func TestHandle_Repair_restoresInventory(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const size = 3
		s := newSem(t, b, "repair", size)
		r, err := s.Repair(ctx)
		require.NoError(t, err)
		assert.Equal(t, admin.RepairReport{}, r, "nothing to repair")
		assert.Equal(t, 0, b.keyCount(t))

		require.NoError(t, s.Resize(ctx, size))
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		e := inv.Epoch
		b.do(t, "LREM", s.k.tokens, 0, e+":2")
		junk := []interface{}{s.k.tokens, "garbage", e + ":3", "000000000000:1", e + ":9"}
		b.do(t, "LPUSH", junk...)
		r, err = s.Repair(ctx)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"garbage", e + ":3", "000000000000:1", e + ":9"}, r.Dropped)
		assert.Equal(t, []string{e + ":2"}, r.Minted)
		assert.Empty(t, r.Missing)
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.Len(t, inv.Free, size)

		// The repaired tokens are usable: exactly size grants (C2).
		held := takeAll(t, ctx, s)
		assert.Len(t, held, size)
		for _, l := range held {
			require.NoError(t, l.Release(ctx))
		}
		requireInventory(t, s, size, 0)
		r, err = s.Repair(ctx)
		require.NoError(t, err)
		assert.Empty(t, r.Dropped)
		assert.Empty(t, r.Minted)
	})
}

// Repair mints more tokens than one command takes (a thousand at a time)
// once each.
func TestHandle_Repair_mintsManyOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const size = 2100
		s := newSem(t, b, "repair-many", size)
		require.NoError(t, s.Resize(ctx, size))
		b.do(t, "DEL", s.k.tokens)
		r, err := s.Repair(ctx)
		require.NoError(t, err)
		assert.Len(t, r.Minted, size)
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv.Duplicates)
		assert.Len(t, inv.Free, size)
	})
}

// Repair never mints while a missing token could be held or in flight: with
// a lease, a lease record or a pending token it drops the junk, mints
// nothing and says why.
func TestHandle_Repair_refusesWhileHeldOrInFlight(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "repair-unsafe", 3)
		held, err := s.TryAcquire(ctx) // slot 1
		require.NoError(t, err)
		e := strings.SplitN(held.Token(), ":", 2)[0]
		b.do(t, "LREM", s.k.tokens, 0, e+":2")
		b.do(t, "LPUSH", s.k.tokens, "junk")

		r, err := s.Repair(ctx)
		require.ErrorIs(t, err, ErrRepairUnsafe)
		assert.Contains(t, err.Error(), "1 lease")
		assert.Equal(t, []string{"junk"}, r.Dropped, "junk goes even so")
		assert.Empty(t, r.Minted)
		assert.Equal(t, []int{2}, r.Missing)
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []int{2}, inv.Missing)
		assert.Empty(t, inv.Strangers)
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken, "no extra permit")
		require.NoError(t, l.Release(ctx))
		require.NoError(t, held.Release(ctx))

		// A token in flight to a waiter blocks minting too.
		fakePending(t, b, s)
		_, err = s.Repair(ctx)
		require.ErrorIs(t, err, ErrRepairUnsafe)
		assert.Contains(t, err.Error(), "1 pending list")
		unfakePending(t, b, s)

		// So does a lease record without its lease.
		b.do(t, "HSET", s.k.holders, "t:"+e+":2", "feedfacefeedface|1|1|x")
		_, err = s.Repair(ctx)
		require.ErrorIs(t, err, ErrRepairUnsafe)
		assert.Contains(t, err.Error(), "1 lease record")
		b.do(t, "HDEL", s.k.holders, "t:"+e+":2")

		// Quiescent: now it mints.
		r, err = s.Repair(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{e + ":2"}, r.Minted)
		requireInventory(t, s, 3, 0)
	})
}

// Repair gives back what expired first, so a crashed holder does not block
// it for longer than its lease.
func TestHandle_Repair_reclaimsExpiredFirst(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 60*time.Second)
		// A TTL the first Repair comes well within, however slow the
		// machine; the second waits for the server's clock to pass it.
		s := newSem(t, b, "repair-expired", 2, WithTTL(3*time.Second), WithFixedTTL())
		held, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		lost, err := redis.String(b.do(t, "LPOP", s.k.tokens), nil)
		require.NoError(t, err)
		_, err = s.Repair(ctx)
		require.ErrorIs(t, err, ErrRepairUnsafe)
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && len(st.Holders) == 1 && st.ServerTime.After(st.Holders[0].Deadline)
		}, 30*time.Second, 20*time.Millisecond, "the lease expires")
		r, err := s.Repair(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, r.Reclaimed)
		assert.Equal(t, []string{lost}, r.Minted)
		require.True(t, errors.Is(held.Release(ctx), ErrLeaseLost))
		requireInventory(t, s, 2, 0)
	})
}
