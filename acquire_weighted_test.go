package redsem

import (
	"context"
	"errors"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/failpoint"
)

// collecting returns the tokens Status shows as held with fence 0: those of
// a weighted acquisition that is still collecting.
func collecting(t testing.TB, s *Semaphore) []string {
	t.Helper()
	st, err := s.Status(context.Background())
	require.NoError(t, err)
	var toks []string
	for _, h := range st.Holders {
		if h.Fence == 0 {
			toks = append(toks, h.Token)
		}
	}
	return toks
}

// extraKeys counts the keys a weighted acquisition may create besides the
// five of the semaphore (doorbells, the ticket queue, pending lists).
func extraKeys(t testing.TB, b *backend, s *Semaphore) int {
	t.Helper()
	ks, err := redis.Strings(b.do(t, "KEYS", s.k.base+"*"), nil)
	require.NoError(t, err)
	n := 0
	for _, k := range ks {
		switch k {
		case s.k.meta, s.k.tokens, s.k.leases, s.k.holders, s.k.waits:
		default:
			n++
		}
	}
	return n
}

func TestSemaphore_AcquireN_basics(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "weighted", 4)
		for _, k := range []int{-1, 0, 5} {
			_, err := s.AcquireN(ctx, k)
			require.ErrorIs(t, err, ErrInvalidSize, "k=%d", k)
			_, err = s.TryAcquireN(ctx, k)
			require.ErrorIs(t, err, ErrInvalidSize, "k=%d", k)
		}

		one, err := s.AcquireN(ctx, 1)
		require.NoError(t, err)
		assert.Equal(t, []string{one.Token()}, one.Tokens())

		l, err := s.AcquireN(ctx, 3)
		require.NoError(t, err)
		toks := l.Tokens()
		require.Len(t, toks, 3)
		assert.Equal(t, toks[0], l.Token())
		assert.Greater(t, l.Fence(), one.Fence())
		seen := map[string]bool{one.Token(): true}
		for _, tok := range toks {
			assert.False(t, seen[tok], "token %s twice", tok)
			seen[tok] = true
		}
		st, err := s.Status(ctx)
		require.NoError(t, err)
		require.Len(t, st.Holders, 4)
		fences := map[int64]int{}
		for _, h := range st.Holders {
			fences[h.Fence]++
		}
		assert.Equal(t, map[int64]int{one.Fence(): 1, l.Fence(): 3}, fences, "one holder per token, one fence per lease")

		_, err = s.TryAcquireN(ctx, 2)
		require.ErrorIs(t, err, ErrNoToken)
		require.NoError(t, one.Release(ctx))
		_, err = s.TryAcquireN(ctx, 2)
		require.ErrorIs(t, err, ErrNoToken)
		requireInventory(t, s, 1, 3)

		// Double release: ErrReleased, and nothing pushed.
		require.NoError(t, l.Release(ctx))
		assert.Equal(t, 4, b.llen(t, s.k.tokens))
		require.ErrorIs(t, l.Release(ctx), ErrReleased)
		require.ErrorIs(t, l.Refresh(ctx, time.Second), ErrReleased)
		assert.Equal(t, 4, b.llen(t, s.k.tokens))
		requireInventory(t, s, 4, 0)

		all, err := s.TryAcquireN(ctx, 4)
		require.NoError(t, err)
		assert.Len(t, all.Tokens(), 4)
		require.NoError(t, all.Release(ctx))
		requireInventory(t, s, 4, 0)
		assert.Equal(t, 0, extraKeys(t, b, s), "no doorbell, queue or pending list left")
	})
}

// All or nothing: a weighted request that times out or finds too few tokens
// holds none afterwards, and the semaphore is exactly as before.
func TestSemaphore_AcquireN_allOrNothing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "all-or-nothing", 4)
		h1, err := s.Acquire(ctx)
		require.NoError(t, err)
		h2, err := s.Acquire(ctx)
		require.NoError(t, err)

		_, err = s.TryAcquireN(ctx, 3)
		require.ErrorIs(t, err, ErrNoToken)
		requireInventory(t, s, 2, 2)

		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err = s.AcquireN(tctx, 3)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, ctx.Err(), "AcquireN outlived its own context")
		requireInventory(t, s, 2, 2)
		assert.Empty(t, collecting(t, s))

		require.NoError(t, h1.Release(ctx))
		l, err := s.TryAcquireN(ctx, 3)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, h2.Release(ctx))
		requireInventory(t, s, 4, 0)
	})
}

// Head of the queue: once a weighted request holds a token, released tokens
// go to it, and a single-permit Acquire that came later waits behind it.
func TestSemaphore_AcquireN_holdsTheHead(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "head", 3)
		hs := holdN(t, ctx, s.Acquire, 3)
		big := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 3) })
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 5*time.Second, 5*time.Millisecond, "collector waits")
		time.Sleep(50 * time.Millisecond) // its BLMOVE reaches Redis
		require.NoError(t, hs[0].Release(ctx))
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 1 }, 5*time.Second, 5*time.Millisecond, "first token by the FIFO")

		small := acquireAsync(ctx, s.Acquire)
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 2 }, 5*time.Second, 5*time.Millisecond, "single waiter behind")
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, hs[1].Release(ctx))
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 2 }, 5*time.Second, 5*time.Millisecond, "released token goes to the collector")
		assert.Equal(t, 0, b.llen(t, s.k.tokens))
		require.NoError(t, hs[2].Release(ctx))

		l, ok := <-big
		require.True(t, ok, "the weighted request is granted")
		assert.Len(t, l.Tokens(), 3)
		select {
		case x := <-small:
			t.Fatalf("the later single-permit waiter overtook the collector: %v", x.Token())
		case <-time.After(100 * time.Millisecond):
		}
		require.NoError(t, l.Release(ctx))
		x, ok := <-small
		require.True(t, ok)
		require.NoError(t, x.Release(ctx))
		requireInventory(t, s, 3, 0)
		assert.Equal(t, 0, extraKeys(t, b, s))
	})
}

// A waiter behind the collector that gives up leaves the ticket where it
// is: the collector keeps collecting and is served before the one behind.
func TestSemaphore_AcquireN_cancelledWaiterLeavesTheTicket(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		s := newSem(t, b, "ticket-kept", 4)
		hs := holdN(t, ctx, s.Acquire, 4)
		type grant struct {
			who string
			l   *Lease
			err error
		}
		got := make(chan grant, 3)
		bctx, cancelB := context.WithCancel(ctx)
		for i, w := range []struct {
			who string
			ctx context.Context
			k   int
		}{{"collector", ctx, 3}, {"leaver", bctx, 2}, {"behind", ctx, 2}} {
			go func() {
				l, err := s.AcquireN(w.ctx, w.k)
				got <- grant{w.who, l, err}
			}()
			require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == i+1 }, 10*time.Second, 5*time.Millisecond)
		}
		cancelB()
		g := <-got
		require.Equal(t, "leaver", g.who)
		require.ErrorIs(t, g.err, context.Canceled)
		for _, h := range hs {
			require.NoError(t, h.Release(ctx))
		}
		g = <-got
		require.NoError(t, g.err)
		require.Equal(t, "collector", g.who, "the first served")
		require.NoError(t, g.l.Release(ctx))
		g = <-got
		require.NoError(t, g.err)
		require.Equal(t, "behind", g.who)
		require.NoError(t, g.l.Release(ctx))
		requireInventory(t, s, 4, 0)
	})
}

// Weighted requests get the collector ticket first come, first served.
func TestSemaphore_AcquireN_ticketOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "ticket-order", 4)
		hs := holdN(t, ctx, s.Acquire, 4)
		order := make(chan int, 3)
		leases := make(chan *Lease, 3)
		errs := make(chan error, 3)
		for i, k := range []int{2, 3, 2} {
			go func() {
				l, err := s.AcquireN(ctx, k)
				if err != nil {
					errs <- err
					return
				}
				order <- i
				leases <- l
			}()
			require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == i+1 }, 5*time.Second, 5*time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		// Four tokens come back one at a time; each grant is released at once.
		released := make(chan error, 1)
		go func() {
			var err error
			for _, h := range hs {
				err = errors.Join(err, h.Release(ctx))
				time.Sleep(20 * time.Millisecond)
			}
			released <- err
		}()
		var got []int
		for len(got) < 3 {
			select {
			case i := <-order:
				got = append(got, i)
				require.NoError(t, (<-leases).Release(ctx))
			case err := <-errs:
				require.NoError(t, err)
			case <-ctx.Done():
				t.Fatalf("granted only %v", got)
			}
		}
		assert.Equal(t, []int{0, 1, 2}, got)
		require.NoError(t, <-released)
		requireInventory(t, s, 4, 0)
	})
}

// A collector cancelled mid-collection gives its tokens back at once: the
// inventory is exact the moment AcquireN returns.
func TestSemaphore_AcquireN_cancelReturnsTokensAtOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		s := newSem(t, b, "cancel-collect", 4)
		hs := holdN(t, ctx, s.Acquire, 3)
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := s.AcquireN(cctx, 4)
			errc <- err
		}()
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 1 }, 5*time.Second, 5*time.Millisecond)
		require.NoError(t, hs[0].Release(ctx))
		require.Eventually(t, func() bool { return len(collecting(t, s)) == 2 }, 5*time.Second, 5*time.Millisecond)
		inv, err := s.Check(ctx)
		require.NoError(t, err)
		assert.True(t, inv.Healthy(), "%+v", inv)
		assert.Len(t, inv.Leased, 4, "collected tokens count as leased")
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)
		requireInventory(t, s, 2, 2)
		assert.Empty(t, collecting(t, s))

		// The ticket is free again: another weighted request goes through.
		l, err := s.TryAcquireN(ctx, 2)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, hs[1].Release(ctx))
		require.NoError(t, hs[2].Release(ctx))
		requireInventory(t, s, 4, 0)
		assert.Equal(t, 0, extraKeys(t, b, s))
	})
}

// More tokens than one command takes (the scripts write a thousand at a
// time) come back once each: those of a cancelled collection, and those of
// a granted lease that abort_n.lua settles in mode "release" (as it does a
// grant whose reply was lost).
func TestSemaphore_AcquireN_manyTokensComeBackOnce(t *testing.T) {
	if !alone(t) {
		return
	}
	// Alone: beside the parallel tests in one process, the 2100-token
	// collection on miniredis did not reach its last token within 90 s.
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 2*time.Minute)
		const size = 2100
		s := newSem(t, b, "many-back", size)
		healthy := func() {
			t.Helper()
			inv, err := s.Check(ctx)
			require.NoError(t, err)
			assert.True(t, inv.Healthy(), "%+v", inv.Duplicates)
		}
		x, err := s.TryAcquire(ctx)
		require.NoError(t, err)
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := s.AcquireN(cctx, size)
			errc <- err
		}()
		// Polled slowly: a Status of 2100 holders is a large reply, and
		// polled every 10ms it crowded out the collection it waits for.
		require.Eventually(t, func() bool { return len(collecting(t, s)) == size-1 }, 90*time.Second, 250*time.Millisecond)
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)
		requireInventory(t, s, size-1, 1)
		healthy()
		require.NoError(t, x.Release(ctx))

		l, err := s.AcquireN(ctx, size)
		require.NoError(t, err)
		r, err := s.abortN(ctx, l.acqID, size, "release")
		require.NoError(t, err)
		require.Equal(t, int64(engine.CodeReleased), r.Code)
		requireInventory(t, s, size, 0)
		healthy()
		require.ErrorIs(t, l.Release(ctx), ErrLeaseLost, "settled behind its back")
	})
}

// A collector that dies mid-collection (a raw client that runs the first
// script and vanishes) loses its tokens and the ticket within one block plus
// the grace: the next weighted request takes over.
func TestSemaphore_AcquireN_crashedCollector(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 40*time.Second)
		const grace = 100 * time.Millisecond
		s := newSem(t, b, "crash-collect", 4, WithGrace(grace))
		hs := holdN(t, ctx, s.Acquire, 2)
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		const block = 300
		r, err := parseAcquireNReply(engine.AcquireN.Do(c, s.acquireNCall(engine.NewAcqID(), 3, block, "fresh").KeysAndArgs...))
		c.Close()
		crashed := time.Now()
		require.NoError(t, err)
		require.Equal(t, int64(0), r.Code)
		require.Equal(t, int64(modeCollect), r.Mode)
		require.Len(t, collecting(t, s), 2, "the dead collector holds the two free tokens")

		// A live weighted request queues for the ticket, takes it over at the
		// dead collector's deadline, and is granted once a holder releases.
		got := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 3) })
		// The release comes once the dead collector's block has run out, so
		// that the live request, not the dead one, collects the token.
		time.Sleep(time.Until(crashed.Add(block * time.Millisecond)))
		require.NoError(t, hs[0].Release(ctx))
		l, ok := <-got
		require.True(t, ok)
		took := time.Since(crashed)
		t.Logf("%s: weighted request granted %v after the collector died (block + grace: %v)", b.name, took, block*time.Millisecond+grace)
		require.NoError(t, l.Release(ctx))
		require.NoError(t, hs[1].Release(ctx))
		requireInventory(t, s, 4, 0)

		// With no weighted request around, the tokens come back by the
		// ordinary reclaim, even one a Release handed to the dead collector.
		h, err := s.Acquire(ctx)
		require.NoError(t, err)
		c, err = redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		_, err = engine.AcquireN.Do(c, s.acquireNCall(engine.NewAcqID(), 4, block, "fresh").KeysAndArgs...)
		require.NoError(t, err)
		c.Close()
		crashed = time.Now()
		require.NoError(t, h.Release(ctx))
		assert.Len(t, collecting(t, s), 4)
		_, err = s.TryAcquire(ctx) // the dead collector holds every token
		require.ErrorIs(t, err, ErrNoToken)
		require.Eventually(t, func() bool {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				return false
			}
			return l.Release(ctx) == nil
		}, 20*time.Second, 10*time.Millisecond)
		t.Logf("%s: tokens back %v after the collector died", b.name, time.Since(crashed))
		requireInventory(t, s, 4, 0)
	})
}

// No starvation: a stream of single-permit acquirers keeps a size-4
// semaphore busy; a request for 3 still completes within a bound.
func TestSemaphore_AcquireN_notStarved(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const size, workers = 4, 8
		s := newSem(t, b, "starve", size)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var singles atomic.Int64
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				ws, err := NewSemaphore(newPool(t, b.addr), "starve", size)
				if err != nil {
					errs <- err
					return
				}
				for {
					select {
					case <-stop:
						return
					default:
					}
					l, err := ws.Acquire(ctx)
					if err != nil {
						errs <- err
						return
					}
					singles.Add(1)
					time.Sleep(time.Duration(2+rng.Intn(4)) * time.Millisecond)
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}(int64(w))
		}
		require.Eventually(t, func() bool { return singles.Load() > 50 }, 5*time.Second, time.Millisecond)
		// Served in its turn, the request lets past it a few single-permit
		// grants (those queued before it, those while it collects); a
		// starved one would let thousands past before ctx ends. Counted in
		// grants, not time, so that a loaded machine does not fail it.
		var took []time.Duration
		var passed []int64
		for i := 0; i < 3; i++ {
			start, before := time.Now(), singles.Load()
			l, err := s.AcquireN(ctx, 3)
			require.NoError(t, err)
			took, passed = append(took, time.Since(start)), append(passed, singles.Load()-before)
			time.Sleep(5 * time.Millisecond)
			require.NoError(t, l.Release(ctx))
			time.Sleep(20 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: AcquireN(3) took %v, %v single-permit grants passing it, among %d", b.name, took, passed, singles.Load())
		for _, n := range passed {
			assert.LessOrEqual(t, n, int64(10*workers), "the weighted request is not starved")
		}
		requireInventory(t, s, size, 0)
	})
}

// Two weighted requests that together want more than the size never
// deadlock, with or without single-permit traffic around them.
func TestSemaphore_AcquireN_noDeadlock(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const size, rounds = 4, 15
		s := newSem(t, b, "deadlock", size)
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		var done atomic.Int64
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				ws, err := NewSemaphore(newPool(t, b.addr), "deadlock", size)
				if err != nil {
					errs <- err
					return
				}
				for i := 0; i < rounds; i++ {
					k := 3
					if w == 2 {
						k = 1
					}
					l, err := ws.AcquireN(ctx, k)
					if err != nil {
						errs <- err
						return
					}
					time.Sleep(time.Millisecond)
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
					done.Add(1)
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		assert.Equal(t, int64(3*rounds), done.Load())
		requireInventory(t, s, size, 0)
	})
}

// The hammer, weighted: goroutines mix Acquire and AcquireN(k). At every
// instant the permits held sum to at most the size, no token is held twice,
// the size is reached, and afterwards exactly size tokens are free. It runs
// for dur and then on until the size was reached and every k was granted
// (the checks could not fail otherwise), two minutes at most: on a loaded
// machine 1.5s was not always enough for both, nor 20s beside other tests.
func TestSemaphore_AcquireN_hammer(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const size, workers = 5, 10
		dur := 1500 * time.Millisecond
		ctx := ctxT(t, 3*time.Minute)
		var (
			mu       sync.Mutex
			holding  = map[string]bool{}
			fences   = map[int64]bool{}
			cur, max int
			grants   [6]int
			problems []string
		)
		deadline, hardStop := time.Now().Add(dur), time.Now().Add(2*time.Minute)
		going := func() bool {
			if time.Now().Before(deadline) {
				return true
			}
			mu.Lock()
			defer mu.Unlock()
			covered := max == size && grants[1] > 0 && grants[2] > 0 && grants[3] > 0 && grants[4] > 0
			return !covered && time.Now().Before(hardStop)
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed int64) {
				defer wg.Done()
				rng := rand.New(rand.NewSource(seed))
				s, err := NewSemaphore(newPool(t, b.addr), "hammer-n", size, WithGrace(200*time.Millisecond))
				if err != nil {
					errs <- err
					return
				}
				for going() {
					k := 1 + rng.Intn(4)
					var l *Lease
					if rng.Intn(2) == 0 {
						k = 1
						l, err = s.Acquire(ctx)
					} else {
						l, err = s.AcquireN(ctx, k)
					}
					if err != nil {
						errs <- err
						return
					}
					toks := l.Tokens()
					mu.Lock()
					if len(toks) != k {
						problems = append(problems, "wrong token count")
					}
					cur += len(toks)
					grants[k]++
					if cur > max {
						max = cur
					}
					for _, tok := range toks {
						if holding[tok] {
							problems = append(problems, "token held twice: "+tok)
						}
						holding[tok] = true
					}
					if fences[l.Fence()] {
						problems = append(problems, "fence reused")
					}
					fences[l.Fence()] = true
					mu.Unlock()
					time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
					mu.Lock()
					cur -= len(toks)
					for _, tok := range toks {
						holding[tok] = false
					}
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}(int64(w))
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		t.Logf("%s: grants by k %v, max permits held at once %d of %d", b.name, grants[1:5], max, size)
		assert.Empty(t, problems)
		assert.Equal(t, size, max, "the limit was reached, so the check could fail")
		for k := 1; k <= 4; k++ {
			assert.Positive(t, grants[k], "k=%d was granted", k)
		}
		s := newSem(t, b, "hammer-n", size)
		requireInventory(t, s, size, 0)
		assert.Equal(t, 0, extraKeys(t, b, s))
	})
}

// freezeCollector makes a weighted acquisition of k permits of s's semaphore
// that dies while it collects: on connections of its own, it runs until it
// writes its first wait, then stops there for good (the failpoint holds its
// goroutine, as a process killed or frozen would be) while its connection
// is killed, so its script never runs again. It returns once that is so;
// the goroutine is let go when the test ends.
func freezeCollector(t *testing.T, ctx context.Context, b *backend, s *Semaphore, k int) {
	t.Helper()
	name := "collector-" + engine.NewAcqID()[:12]
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", b.addr, redis.DialClientName(name))
	}}
	c, err := NewSemaphore(pool, s.name, s.size)
	require.NoError(t, err)
	var armed atomic.Bool
	armed.Store(true)
	hit, thaw, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	failpoint.Set(func(p string) bool {
		if p == "wait.sent" && armed.CompareAndSwap(true, false) {
			close(hit)
			<-thaw
		}
		return false
	})
	defer failpoint.Set(nil)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(done)
		_, _ = c.AcquireN(cctx, k)
	}()
	t.Cleanup(func() {
		cancel()
		close(thaw)
		<-done
		pool.Close()
	})
	select {
	case <-hit:
	case <-ctx.Done():
		t.Fatal("the collector never waited")
	}
	info, err := redis.String(b.do(t, "CLIENT", "LIST"), nil)
	require.NoError(t, err)
	killed := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.Contains(line, " name="+name+" ") {
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			b.do(t, "CLIENT", "KILL", "ID", id)
			killed++
		}
	}
	require.Positive(t, killed, "no connection of the collector to kill")
}

// A collector that dies while it collects, with the default block time and
// grace, does not keep the head of the weighted queue and its tokens: the
// next weighted request takes the ticket over, with the tokens; and without
// a weighted request around, Acquire callers get the tokens. How soon, in
// Redis time: TestSemaphore_AcquireN_deadCollectorHandOnInRedisTime.
func TestSemaphore_AcquireN_deadCollectorHandsOn(t *testing.T) {
	if !alone(t) {
		return
	}
	b := realRedis(t)
	ctx := ctxT(t, 30*time.Second)
	s := newSem(t, b, "dead-collector", 4)

	hs := holdN(t, ctx, s.Acquire, 2)
	freezeCollector(t, ctx, b, s, 3)
	died := time.Now()
	require.Len(t, collecting(t, s), 2, "the dead collector holds the two free tokens")
	require.NoError(t, hs[0].Release(ctx)) // to the dead collector: it holds the head
	require.Len(t, collecting(t, s), 3)
	l, err := s.AcquireN(ctx, 3)
	require.NoError(t, err)
	took := time.Since(died)
	t.Logf("the next weighted request was granted %v after the collector died (about a second; 6s before)", took.Round(time.Millisecond))
	require.NoError(t, l.Release(ctx))
	require.NoError(t, hs[1].Release(ctx))
	requireInventory(t, s, 4, 0)

	hs = holdN(t, ctx, s.Acquire, 2)
	freezeCollector(t, ctx, b, s, 3)
	died = time.Now()
	for i := 0; i < 2; i++ {
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		hs = append(hs, l)
	}
	took = time.Since(died)
	t.Logf("Acquire callers got the dead collector's tokens %v after it died (about a second; 6s before)", took.Round(time.Millisecond))
	for _, h := range hs {
		require.NoError(t, h.Release(ctx))
	}
	requireInventory(t, s, 4, 0)
}

// The hand-on after a weighted collector dies, counted in Redis time
// (miniredis's clock, moved by the test; each run of a script below is the
// one its waiter's wait ends in), in the faults test's setting: N=4, TTL 2s,
// grace 5s, a holder of 3 and a collector C of 3 holding the fourth. C dies.
// The next waiter's wait ends collectPoll + collectGrace + 1ms at most after
// C's last check-in, and that one run gets C's tokens: a weighted request
// queued for the ticket takes it over and is granted all 3 (the holder's
// release went to C meanwhile, whose registration had not lapsed yet), an
// Acquire waiter sweeps C's partial lease and is granted its token.
func TestSemaphore_AcquireN_deadCollectorHandOnInRedisTime(t *testing.T) {
	t.Parallel()
	for _, weighted := range []bool{true, false} {
		m := miniredis.RunT(t)
		b := &backend{name: "miniredis", mini: m, addr: m.Addr(), pool: newPool(t, m.Addr())}
		ctx := ctxT(t, 10*time.Second)
		t0 := time.UnixMilli(1_800_000_000_000)
		now := t0
		at := func(d time.Duration) { // Redis time is t0 + d
			m.FastForward(t0.Add(d).Sub(now))
			now = t0.Add(d)
			m.SetTime(now)
		}
		at(0)
		s := newSem(t, b, "handon-redis-time", 4, WithTTL(2*time.Second), WithFixedTTL(), WithGrace(5*time.Second))
		h, err := s.AcquireN(ctx, 3)
		require.NoError(t, err)
		c := b.pool.Get()
		defer c.Close()
		// run runs acq's script in phase, an acquisition of k tokens.
		run := func(acq string, k int, phase string) engine.Reply {
			t.Helper()
			var r engine.Reply
			var err error
			if k == 1 {
				r, err = parseAcquireReply(engine.Acquire.Do(c, s.acquireCall(acq, engine.MaxBlock, phase).KeysAndArgs...))
			} else {
				r, err = parseAcquireNReply(engine.AcquireN.Do(c, s.acquireNCall(acq, k, engine.MaxBlock.Milliseconds(), phase).KeysAndArgs...))
			}
			require.NoError(t, err)
			return r
		}

		at(time.Millisecond)
		r := run(engine.NewAcqID(), 3, "fresh") // the collector's last check-in: it dies here
		died := now
		require.Equal(t, int64(engine.CodeWaiting), r.Code)
		require.Equal(t, int64(modeCollect), r.Mode)
		require.Len(t, collecting(t, s), 1)

		at(2 * time.Millisecond)
		next, k := engine.NewAcqID(), 1
		if weighted {
			k = 3
		}
		r = run(next, k, "fresh")
		require.Equal(t, int64(engine.CodeWaiting), r.Code)
		checkIn := now.Add(r.Block) // when its wait ends, nothing having come
		if weighted {
			require.Equal(t, int64(modeQueued), r.Mode)
			at(20 * time.Millisecond)
			require.NoError(t, h.Release(ctx))
			require.Len(t, collecting(t, s), 3, "the release went to the dead collector")
		}

		at(checkIn.Sub(t0))
		r = run(next, k, "wait")
		require.Equal(t, int64(engine.CodeGranted), r.Code, "weighted %v: its first check-in after the collector's registration lapsed", weighted)
		require.Len(t, r.Tokens, k)
		handOn := time.UnixMicro(r.NowUs).Sub(died)
		t.Logf("weighted %v: granted %v of Redis time after the collector's last check-in", weighted, handOn)
		assert.LessOrEqual(t, handOn, collectPoll+collectGrace+time.Millisecond, "weighted %v", weighted)
		assert.Empty(t, collecting(t, s))
		if weighted {
			requireInventory(t, s, 1, 3)
		} else {
			requireInventory(t, s, 0, 4)
		}
	}
}

// A collector's wait and its script are one write (BLPOP on its doorbell,
// then acquire_n.lua): when a release rings it, Redis runs the script and
// seals the grant without its client, stopped or about to be killed. So a
// process that Status showed collecting can die holding a granted lease:
// its tokens then come back by the lease's TTL, not by the registration's
// lapse. This is what made the faults test's kills take 2s (its TTL) now
// and then: the release landed between its Status and its kill -9.
func TestSemaphore_AcquireN_collectorSealsWithoutItsClient(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 10*time.Second)
		const ttl = 2 * time.Second
		s := newSem(t, b, "seal-unread", 4, WithTTL(ttl), WithFixedTTL(), WithLabel("holder"))
		h, err := s.AcquireN(ctx, 3)
		require.NoError(t, err)
		c, err := redis.Dial("tcp", b.addr)
		require.NoError(t, err)
		defer c.Close()
		collector := engine.NewAcqID()
		args := func(phase string) []interface{} {
			return s.acquireNCall(collector, 3, engine.MaxBlock.Milliseconds(), phase).KeysAndArgs
		}
		r, err := parseAcquireNReply(engine.AcquireN.Do(c, args("fresh")...))
		require.NoError(t, err)
		require.Equal(t, int64(modeCollect), r.Mode)
		// Its next wait, written as the driver writes it, and never read: a
		// BLPOP that only the doorbell ends.
		require.NoError(t, c.Send("BLPOP", s.k.bell(collector), "30"))
		require.NotEmpty(t, engine.AcquireN.Hash(), "loaded by the fresh run above")
		require.NoError(t, c.Send("EVALSHA", append([]interface{}{engine.AcquireN.Hash(), 8}, args("wait")...)...))
		require.NoError(t, c.Flush())
		require.Len(t, collecting(t, s), 1, "collecting, as Status shows it")

		require.NoError(t, h.Release(ctx)) // rings the collector
		var granted []admin.Holder
		require.Eventually(t, func() bool {
			st, err := s.Status(ctx)
			require.NoError(t, err)
			granted = granted[:0]
			for _, h := range st.Holders {
				if h.Fence != 0 {
					granted = append(granted, h)
				}
			}
			return len(granted) == 3
		}, 5*time.Second, time.Millisecond, "sealed by Redis alone")
		require.NoError(t, c.Close()) // killed, too late
		for _, h := range granted {
			assert.Equal(t, ttl, h.Deadline.Sub(h.Acquired), "a granted lease: back after its TTL")
		}
		assert.Empty(t, collecting(t, s))
	})
}

// acquireNWith is acquire_n.lua, after its helpers, with the line from
// replaced by to: a test's way to change one of its constants.
func acquireNWith(t testing.TB, from, to string) *engine.Script {
	src := engine.Source("acquire_n.lua")
	require.Contains(t, src, from)
	return engine.Lua(8, strings.Replace(src, from, to, 1))
}

// A collection that outlasts the backstop deadline of its partial leases
// (PARTIAL_MS, an hour; 3s here) keeps them: the collector pushes them
// forward as it checks in, and the token it took first is granted.
func TestSemaphore_AcquireN_partialLeasesOutliveTheirBackstop(t *testing.T) {
	if !alone(t) {
		return
	}
	saved := engine.AcquireN
	engine.AcquireN.Script = acquireNWith(t, "local PARTIAL_MS = 3600000\n", "local PARTIAL_MS = 3000\n")
	defer func() { engine.AcquireN = saved }()
	b := realRedis(t)
	ctx := ctxT(t, 20*time.Second)
	s := newSem(t, b, "backstop", 3)
	hs := holdN(t, ctx, s.Acquire, 2)
	got := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, 3) })
	require.Eventually(t, func() bool { return len(collecting(t, s)) == 1 }, 5*time.Second, 5*time.Millisecond)
	first := collecting(t, s)[0]
	owner := func() string {
		rec, err := redis.String(b.do(t, "HGET", s.k.holders, "t:"+first), nil)
		require.NoError(t, err)
		acq, _, _ := strings.Cut(rec, "|")
		return acq
	}
	collector := owner()
	time.Sleep(4 * time.Second) // past the first deadline of its partial lease
	assert.Equal(t, collector, owner(), "the same acquisition holds it: it did not start over")
	st, err := s.Status(ctx)
	require.NoError(t, err)
	var h *admin.Holder
	for i := range st.Holders {
		if st.Holders[i].Token == first {
			h = &st.Holders[i]
		}
	}
	require.NotNil(t, h, "the collector still holds %s", first)
	assert.Greater(t, h.Deadline.Sub(st.ServerTime), 500*time.Millisecond)
	for _, h := range hs {
		require.NoError(t, h.Release(ctx))
	}
	l, ok := <-got
	require.True(t, ok)
	assert.Contains(t, l.Tokens(), first)
	assert.Equal(t, collector, l.acqID, "granted to the acquisition that collected it")
	require.NoError(t, l.Release(ctx))
	requireInventory(t, s, 3, 0)
}

// Requests larger than one run of acquire_n.lua takes or seals (STEP, 128
// tokens) are collected and sealed over several runs: all at once, from
// releases one by one, and given back whole when cancelled half way.
func TestSemaphore_AcquireN_large(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 2*time.Minute)
		const size = 300
		s := newSem(t, b, "large-n", size)
		check := func(l *Lease) {
			t.Helper()
			toks := l.Tokens()
			require.Len(t, toks, size)
			seen := map[string]bool{}
			for _, tok := range toks {
				require.False(t, seen[tok], "token %s twice", tok)
				seen[tok] = true
			}
			st, err := s.Status(ctx)
			require.NoError(t, err)
			require.Len(t, st.Holders, size)
			for _, h := range st.Holders {
				require.Equal(t, l.Fence(), h.Fence, "one fence for the whole lease")
			}
			require.NoError(t, l.Release(ctx))
			requireInventory(t, s, size, 0)
			assert.Equal(t, 0, extraKeys(t, b, s))
		}

		l, err := s.AcquireN(ctx, size)
		require.NoError(t, err)
		check(l)
		l, err = s.TryAcquireN(ctx, size)
		require.NoError(t, err)
		check(l)

		hs := holdN(t, ctx, s.Acquire, size)
		got := acquireAsync(ctx, func(ctx context.Context) (*Lease, error) { return s.AcquireN(ctx, size) })
		require.Eventually(t, func() bool { return b.zcard(t, s.k.waits) == 1 }, 60*time.Second, 5*time.Millisecond)
		time.Sleep(50 * time.Millisecond) // its BLMOVE reaches Redis
		for _, h := range hs {
			require.NoError(t, h.Release(ctx))
		}
		l, ok := <-got
		require.True(t, ok)
		check(l)

		hs = holdN(t, ctx, s.Acquire, size/2)
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := s.AcquireN(cctx, size)
			errc <- err
		}()
		require.Eventually(t, func() bool { return len(collecting(t, s)) == size/2 }, 60*time.Second, 5*time.Millisecond)
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)
		requireInventory(t, s, size/2, size/2)
		for _, h := range hs {
			require.NoError(t, h.Release(ctx))
		}
		requireInventory(t, s, size, 0)
		assert.Equal(t, 0, extraKeys(t, b, s))
	})
}
