package redsem

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// slotOf returns the slot of a token "<epoch>:<slot>".
func slotOf(t testing.TB, tok string) int {
	t.Helper()
	_, s, ok := strings.Cut(tok, ":")
	require.True(t, ok, tok)
	n, err := strconv.Atoi(s)
	require.NoError(t, err, tok)
	return n
}

// takeAll takes every free token with TryAcquire and returns the leases by
// slot.
func takeAll(t testing.TB, ctx context.Context, s *Semaphore) map[int]*Lease {
	t.Helper()
	held := map[int]*Lease{}
	for {
		l, err := s.TryAcquire(ctx)
		if errors.Is(err, ErrNoToken) {
			return held
		}
		require.NoError(t, err)
		held[slotOf(t, l.Token())] = l
	}
}

func TestHandle_Resize_validatesAndCreates(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "made", 4)
		for _, n := range []int{0, -1, MaxSize + 1} {
			require.ErrorIs(t, s.Resize(ctx, n), ErrInvalidSize, "n=%d", n)
		}
		assert.Equal(t, 0, b.keyCount(t), "nothing written for a bad size")

		// Resize creates a semaphore that does not exist, with its size.
		require.NoError(t, s.Resize(ctx, 6))
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Exists)
		assert.Equal(t, 6, inv.Size)
		assert.Len(t, inv.Free, 6)
		assert.True(t, inv.Healthy(), "%+v", inv)
		s6 := newSem(t, b, "made", 6, WithFixedTTL()) // its leases are dropped
		assert.Len(t, takeAll(t, ctx, s6), 6)

		// Resizing to the size in force changes nothing.
		require.NoError(t, s.Resize(ctx, 6))
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.Len(t, inv.Leased, 6)
		assert.Empty(t, inv.Free)
		assert.True(t, inv.Healthy(), "%+v", inv)
	})
}

// A client of the old size gets the mismatch error after a Resize; a client
// made WithAdoptSize takes the stored size, and creates with its own.
func TestHandle_Resize_staleAndAdoptingClients(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s5 := newSem(t, b, "adopt", 5)
		l, err := s5.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, s5.Resize(ctx, 8))

		_, err = s5.TryAcquire(ctx)
		var sm *SizeMismatchError
		require.ErrorAs(t, err, &sm)
		assert.Equal(t, 8, sm.Stored)
		assert.Equal(t, 5, sm.Want)
		_, err = s5.Acquire(ctx)
		require.ErrorIs(t, err, ErrSizeMismatch)

		adopter := newSem(t, b, "adopt", 5, WithAdoptSize())
		held := takeAll(t, ctx, adopter)
		assert.Len(t, held, 8, "the adopting client takes the stored size")
		for _, l := range held {
			require.NoError(t, l.Release(ctx))
		}
		l, err = adopter.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		requireInventory(t, newSem(t, b, "adopt", 8), 8, 0)

		fresh := newSem(t, b, "adopt-new", 3, WithAdoptSize())
		l, err = fresh.TryAcquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		st, err := fresh.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 3, st.Size, "an adopting client creates with its own size")
	})
}

// Growing pushes the new tokens at once: blocked waiters are served without
// waiting out their block. A waiter of the old size is woken too and gets the
// mismatch error, and the token it was handed goes back.
//
// The waiters' blocks end by the holder's deadline (DefaultTTL, 30s); ctx
// ends before that, so a waiter served only after its block fails the test.
func TestHandle_Resize_growWakesWaiters(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, DefaultTTL*2/3)
		s := newSem(t, b, "grow", 1, WithAdoptSize())
		held, err := s.Acquire(ctx)
		require.NoError(t, err)

		waiter := newSem(t, b, "grow", 1, WithAdoptSize())
		got := acquireAsync(ctx, waiter.Acquire)
		stale := newSem(t, b, "grow", 1)
		staleErr := make(chan error, 1)
		go func() {
			l, err := stale.Acquire(ctx)
			if err == nil {
				_ = l.Release(ctx)
			}
			staleErr <- err
		}()
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && st.Waiting == 2
		}, 5*time.Second, 5*time.Millisecond, "both waiters block in Redis")

		require.NoError(t, s.Resize(ctx, 3))
		var l *Lease
		select {
		case l = <-got:
			require.NotNil(t, l, "the adopting waiter failed")
		case <-ctx.Done():
			t.Fatal("the adopting waiter was not served")
		}
		select {
		case err := <-staleErr:
			require.ErrorIs(t, err, ErrSizeMismatch)
		case <-ctx.Done():
			t.Fatal("the stale waiter never returned")
		}

		require.NoError(t, l.Release(ctx))
		require.NoError(t, held.Release(ctx))
		require.Eventually(t, func() bool {
			inv, err := s.Check(ctx)
			return err == nil && inv.Healthy() && len(inv.Free) == 3
		}, 5*time.Second, 10*time.Millisecond, "the stale waiter's token came back")
		requireInventory(t, s, 3, 0)
	})
}

// Shrinking retires the tokens above n: free ones at once, held ones when
// they come back, never granted again. Holders drain down to n: while
// retired leases are out, as many valid tokens are withheld.
func TestHandle_Resize_shrinkRetiresHeldTokens(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		// Free tokens above n leave the list at once.
		free := newSem(t, b, "shrink-free", 6, WithAdoptSize())
		require.NoError(t, free.Resize(ctx, 6))
		require.NoError(t, free.Resize(ctx, 2))
		assert.Equal(t, 2, b.llen(t, free.k.tokens))
		inv, err := free.Check(ctx)
		require.NoError(t, err)
		assert.Len(t, inv.Free, 2)
		assert.Empty(t, inv.Strangers)
		assert.True(t, inv.Healthy(), "%+v", inv)
		requireInventory(t, free, 2, 0)

		s := newSem(t, b, "shrink", 5, WithAdoptSize())
		held := takeAll(t, ctx, s)
		require.Len(t, held, 5)
		require.NoError(t, s.Resize(ctx, 3))

		st, err := s.Status(ctx)
		require.NoError(t, err)
		assert.Equal(t, 3, st.Size)
		assert.Len(t, st.Holders, 5, "holders above the new size keep their leases")
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, 3, inv.Size)
		assert.Len(t, inv.Leased, 3)
		assert.ElementsMatch(t, []string{held[4].Token(), held[5].Token()}, inv.Retired)
		assert.True(t, inv.Healthy(), "%+v", inv)

		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken)
		// The retired holders go first: no grant until fewer than 3 hold.
		for _, slot := range []int{5, 4} {
			require.NoError(t, held[slot].Release(ctx), "a retired lease releases normally")
			_, err = s.TryAcquire(ctx)
			require.ErrorIs(t, err, ErrNoToken, "released slot %d came back", slot)
			assert.Equal(t, 0, b.llen(t, s.k.tokens), "the retired token is not pushed")
		}
		require.NoError(t, held[2].Release(ctx))
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, held[2].Token(), l.Token())
		held[2] = l
		for _, slot := range []int{1, 2, 3} {
			require.NoError(t, held[slot].Release(ctx))
		}
		requireInventory(t, s, 3, 0)
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.Len(t, inv.Free, 3)
		assert.Empty(t, inv.Retired)
		assert.True(t, inv.Healthy(), "%+v", inv)

		// When a valid holder gives back first, its token is withheld while
		// the retired ones still hold: holders only drain, down to n.
		s2 := newSem(t, b, "shrink-2", 5, WithAdoptSize())
		held = takeAll(t, ctx, s2)
		require.NoError(t, s2.Resize(ctx, 3))
		require.NoError(t, held[1].Release(ctx))
		_, err = s2.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken, "4 holders of 3: slot 1 is withheld")
		inv, err = s2.Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{held[1].Token()}, inv.Withheld)
		assert.True(t, inv.Healthy(), "%+v", inv)
		require.NoError(t, held[4].Release(ctx))
		_, err = s2.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken, "3 holders of 3: one retired lease is still out")
		require.NoError(t, held[5].Release(ctx))
		l, err = s2.TryAcquire(ctx)
		require.NoError(t, err, "the last retired lease ended: the withheld token is free again")
		assert.Equal(t, held[1].Token(), l.Token())
		held[1] = l
		_, err = s2.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken, "3 holders of 3")
		for _, slot := range []int{1, 2, 3} {
			require.NoError(t, held[slot].Release(ctx))
		}
		requireInventory(t, s2, 3, 0)
		inv, err = s2.Check(ctx)
		require.NoError(t, err)
		assert.Empty(t, inv.Withheld)
		assert.True(t, inv.Healthy(), "%+v", inv)
	})
}

// A shrink drains strictly whatever order tokens come back in, including
// a retired lease that expires instead of being released: holders never
// exceed the new size once they have drained to it, no token is lost, and
// the drain's bookkeeping in meta goes with it.
func TestHandle_Resize_shrinkDrainsStrictly(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "drain", 4, WithAdoptSize(), WithTTL(30*time.Second), WithFixedTTL())
		held := takeAll(t, ctx, s)
		require.Len(t, held, 4)
		require.NoError(t, s.Resize(ctx, 2))
		// Slot 3 and 4 are retired; 4 expires unreleased, 1 is released.
		require.NoError(t, held[1].Release(ctx))
		require.NoError(t, held[3].Release(ctx))
		require.NoError(t, held[2].Refresh(ctx, 5*time.Second))
		_, err := s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken, "holders 2 and 4: the size is reached")
		b.lapse(t, s, held[4].Token()) // 4's lease expires
		l, err := s.TryAcquire(ctx)    // reclaims 4 (dropped) and frees the withheld 1
		require.NoError(t, err)
		assert.Equal(t, held[1].Token(), l.Token())
		_, err = s.TryAcquire(ctx)
		require.ErrorIs(t, err, ErrNoToken, "holders 1 and 2")
		require.NoError(t, l.Release(ctx))
		require.NoError(t, held[2].Release(ctx))
		requireInventory(t, s, 2, 0)
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.Empty(t, inv.Withheld)
		m, err := redis.StringMap(b.do(t, "HGETALL", s.k.meta), nil)
		require.NoError(t, err)
		for f := range m {
			assert.False(t, f == "over" || f == "held" || strings.HasPrefix(f, "h:"), "meta's %s outlived the drain", f)
		}

		// Growing back while retired leases are out returns them to service.
		g := newSem(t, b, "regrow-drain", 3, WithAdoptSize())
		gh := takeAll(t, ctx, g)
		require.NoError(t, g.Resize(ctx, 1))
		require.NoError(t, gh[1].Release(ctx)) // withheld: 3 and 2 still out
		require.NoError(t, g.Resize(ctx, 3))   // nothing is retired now
		l, err = g.TryAcquire(ctx)
		require.NoError(t, err, "the withheld token went back to the list")
		assert.Equal(t, gh[1].Token(), l.Token())
		for _, x := range []*Lease{l, gh[2], gh[3]} {
			require.NoError(t, x.Release(ctx))
		}
		requireInventory(t, g, 3, 0)
	})
}

// A grow does not mint a token that is still held or pending after an
// earlier shrink retired it: that token comes back valid instead, and no
// duplicate appears.
func TestHandle_Resize_growSkipsTokensStillOut(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "regrow", 3, WithAdoptSize())
		held := takeAll(t, ctx, s)
		require.NoError(t, s.Resize(ctx, 2))
		require.NoError(t, s.Resize(ctx, 3))
		assert.Equal(t, 0, b.llen(t, s.k.tokens), "slot 3 is still leased: not minted")
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.Len(t, inv.Leased, 3)
		assert.True(t, inv.Healthy(), "%+v", inv)
		require.NoError(t, held[3].Release(ctx))
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, held[3].Token(), l.Token(), "the retired token came back valid")
		require.NoError(t, l.Release(ctx))

		// A retired token in flight to a waiter (moved into its pending list,
		// its script not yet run) is not minted either.
		require.NoError(t, held[1].Release(ctx))
		tok := b.do(t, "LMOVE", s.k.tokens, s.k.pend("feedfacefeedface"), "LEFT", "RIGHT")
		require.NotNil(t, tok)
		b.do(t, "ZADD", s.k.waits, time.Now().Add(time.Minute).UnixMilli(), "w:feedfacefeedface")
		if slotOf(t, string(tok.([]byte))) != 3 {
			// The list's head was another slot: put slot 3 in flight instead.
			b.do(t, "LPUSH", s.k.tokens, tok)
			b.do(t, "DEL", s.k.pend("feedfacefeedface"))
			b.do(t, "LREM", s.k.tokens, 0, held[3].Token())
			b.do(t, "RPUSH", s.k.pend("feedfacefeedface"), held[3].Token())
		}
		require.NoError(t, s.Resize(ctx, 2))
		require.NoError(t, s.Resize(ctx, 3))
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{held[3].Token()}, inv.Pending)
		assert.Empty(t, inv.Duplicates)
		assert.True(t, inv.Healthy(), "%+v", inv)
		// Settle the pretend waiter by hand.
		b.do(t, "ZREM", s.k.waits, "w:feedfacefeedface")
		b.do(t, "DEL", s.k.pend("feedfacefeedface"))
		b.do(t, "LPUSH", s.k.tokens, held[3].Token())
		require.NoError(t, held[2].Release(ctx))
		requireInventory(t, s, 3, 0)

		// Nor one already back on the list, wherever in it.
		require.NoError(t, s.Resize(ctx, 1))
		b.do(t, "LPUSH", s.k.tokens, held[3].Token())
		require.NoError(t, s.Resize(ctx, 3))
		inv, err = s.Check(ctx)
		require.NoError(t, err)
		assert.Empty(t, inv.Duplicates)
		assert.Len(t, inv.Free, 3)
		assert.True(t, inv.Healthy(), "%+v", inv)
	})
}

// Workers acquire and release while the size changes under them. Every
// grant's slot is within a size in force while it was acquired, no token is
// held twice at once, once the last shrink has drained the holders never
// exceed its size, and afterwards exactly that many tokens are free.
func TestHandle_Resize_hammer(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const workers = 10
		sizes := []int{4, 6, 2, 5, 3} // sizes[i] is in force after i resizes
		last := len(sizes) - 1
		ctx := ctxT(t, 90*time.Second)
		admin := newSem(t, b, "rehammer", sizes[0])
		require.NoError(t, admin.Resize(ctx, sizes[0]))

		var (
			mu       sync.Mutex
			phase    int  // resizes done
			resizing bool // one is running: sizes[phase+1] may be in force
			holding  = map[string]bool{}
			cur      int
			old      int // current holders whose acquire began before the last resize was done
			maxAfter int // most holders at once after the last shrink drained
			grants   int
			problems []string
			stop     bool
		)
		// allowed returns the largest size in force from phase lo to now.
		allowed := func(lo int) int {
			hi := phase
			if resizing {
				hi++
			}
			m := 0
			for _, n := range sizes[lo : hi+1] {
				m = max(m, n)
			}
			return m
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				s, err := NewSemaphore(newPool(t, b.addr), "rehammer", sizes[0], WithAdoptSize())
				if err != nil {
					errs <- err
					return
				}
				for {
					mu.Lock()
					done, lo := stop, phase
					mu.Unlock()
					if done {
						return
					}
					l, err := s.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					slot, _ := strconv.Atoi(strings.SplitN(l.Token(), ":", 2)[1])
					isOld := lo < last
					mu.Lock()
					grants++
					cur++
					if isOld {
						old++
					}
					if holding[l.Token()] {
						problems = append(problems, "token held twice: "+l.Token())
					}
					holding[l.Token()] = true
					if a := allowed(lo); slot > a {
						problems = append(problems, fmt.Sprintf("slot %d granted while the size was at most %d", slot, a))
					}
					if phase == last && old == 0 {
						maxAfter = max(maxAfter, cur)
					}
					mu.Unlock()
					time.Sleep(time.Duration(1000+rng.Intn(4000)) * time.Microsecond)
					mu.Lock()
					cur--
					if isOld {
						old--
					}
					holding[l.Token()] = false
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}(int64(w))
		}
		for i := 1; i <= last; i++ {
			time.Sleep(250 * time.Millisecond)
			mu.Lock()
			resizing = true
			mu.Unlock()
			err := admin.Resize(ctx, sizes[i])
			mu.Lock()
			resizing = false
			phase = i
			mu.Unlock()
			require.NoError(t, err)
		}
		// Run until the final size is reached (so the check could fail):
		// counted, not timed, for a loaded machine grants slowly.
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return maxAfter >= sizes[last]
		}, 60*time.Second, 10*time.Millisecond, "the final size was never reached after the last shrink drained")
		mu.Lock()
		stop = true
		mu.Unlock()
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: %d grants by %d workers, %d at most after the last shrink drained", b.name, grants, workers, maxAfter)
		assert.Empty(t, problems)
		assert.Equal(t, sizes[last], maxAfter, "the final size was reached, so the check could fail")

		final := newSem(t, b, "rehammer", sizes[last])
		requireInventory(t, final, sizes[last], 0)
		inv, err := final.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.Len(t, inv.Free, sizes[last])
		assert.Empty(t, inv.Retired)
	})
}

// Resize and weighted requests: a client made WithAdoptSize checks k against
// the stored size; a shrink while a request collects retires what it
// collected above the new size (never granted), and a client of the old
// size gives back what it collected and reports the mismatch.
func TestHandle_Resize_withAcquireN(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, time.Minute)
		s := newSem(t, b, "resize-n", 2, WithAdoptSize())
		require.NoError(t, s.Resize(ctx, 5))
		l, err := s.AcquireN(ctx, 4)
		require.NoError(t, err, "4 permits of the stored size 5")
		require.NoError(t, l.Release(ctx))
		_, err = s.AcquireN(ctx, 6)
		require.ErrorIs(t, err, ErrInvalidSize, "too many for the stored size")

		// A new semaphore of size 4: singles hold slots 1-3, the collector
		// takes slot 4, then the semaphore shrinks to 3 under it.
		s = newSem(t, b, "resize-n2", 4, WithAdoptSize())
		hs := holdN(t, ctx, s.Acquire, 3)
		got := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 2) })
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 1 }, 30*time.Second, 5*time.Millisecond)
		retired := collecting(t, s)[0]
		require.NoError(t, s.Resize(ctx, 3))
		require.NoError(t, hs[0].Release(ctx))
		require.NoError(t, hs[1].Release(ctx))
		l, ok := <-got
		require.True(t, ok)
		assert.True(t, strings.HasSuffix(retired, ":4"), retired)
		assert.NotContains(t, l.Tokens(), retired, "a retired token is never granted")
		for _, tok := range l.Tokens() {
			assert.True(t, engine.ValidToken(tok, tokenEpoch(tok), 3), tok)
		}
		require.NoError(t, l.Release(ctx))
		require.NoError(t, hs[2].Release(ctx))
		requireInventory(t, s, 3, 0)

		// A client of the old size that is collecting when the size changes.
		old := newSem(t, b, "resize-n2", 3)
		h, err := old.Acquire(ctx)
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() {
			_, err := old.AcquireN(ctx, 3)
			errc <- err
		}()
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 2 }, 30*time.Second, 5*time.Millisecond)
		require.NoError(t, s.Resize(ctx, 4))
		require.NoError(t, h.Release(ctx)) // wakes the collector
		require.ErrorIs(t, <-errc, ErrSizeMismatch)
		// The refused collector gives its tokens back in the background.
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			return err == nil && st.Available == 4 && len(st.Holders) == 0
		}, 30*time.Second, 10*time.Millisecond, "the refused collector's tokens come back")
		requireInventory(t, s, 4, 0)
	})
}

func tokenEpoch(tok string) string {
	epoch, _, _ := strings.Cut(tok, ":")
	return epoch
}
