package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// rogueToken returns a token of the given kind for a semaphore of size n
// with epoch e.
func rogueToken(kind, e string, n int) string {
	switch kind {
	case "forged":
		return []string{"deadbeef0000:1", e + ":0", fmt.Sprintf("%s:%d", e, n+1), e + ":01", e + ":-1", e + ":1.0", e + ": 1"}[rand.IntN(7)]
	case "duplicate":
		return fmt.Sprintf("%s:%d", e, 1+rand.IntN(n))
	default: // garbage
		return []string{"", "garbage", "\x00\xff\xfe", strings.Repeat("x", 1024), "{}:", "1:1:1"}[rand.IntN(6)]
	}
}

// Fault 7: a rogue client LPUSHes forged tokens, duplicates of valid tokens
// and garbage onto the token list while clients run. Status reports them as
// stray, they are dropped when popped, and never are there more than N
// holders.
func TestRogueTokens(t *testing.T) {
	t.Parallel()
	const n = 3
	srv := redistest.Start(t)
	r := newRun(t, srv, n, time.Second, 300*time.Millisecond)
	sem := r.sem()
	k := history.KeysFor("redsem:", r.name)
	// Create the semaphore, then push one of each kind while idle: Status
	// must count them all as stray.
	l, err := sem.TryAcquire(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctxT(t, 5*time.Second)))
	st, err := r.ops().Status(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	epoch := st.Epoch
	pushed := map[string]int{}
	rogue, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer rogue.Close()
	for _, kind := range []string{"forged", "duplicate", "garbage"} {
		_, err := rogue.Do("RPUSH", k.Tokens, rogueToken(kind, epoch, n))
		require.NoError(t, err)
		pushed[kind]++
	}
	st, err = r.ops().Status(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, 3, st.Stray, "Status.Stray with one forged, one duplicate, one garbage token")
	assert.Equal(t, n, st.Available)

	runFor := scaled(5*time.Second, 10)
	for i := 0; i < 6; i++ {
		r.spawn("-dur", runFor.String(), "-holdmin", "5ms", "-holdmax", "50ms")
	}
	maxStray := 0
	end := time.Now().Add(runFor - 500*time.Millisecond)
	for i := 0; time.Now().Before(end) && i < 100000; i++ {
		time.Sleep(time.Duration(5+rand.IntN(25)) * time.Millisecond)
		kind := []string{"forged", "duplicate", "garbage"}[rand.IntN(3)]
		if _, err := rogue.Do("LPUSH", k.Tokens, rogueToken(kind, epoch, n)); err == nil {
			pushed[kind]++
		}
		if i%20 == 0 {
			if st, err := r.ops().Status(context.Background()); err == nil && st.Stray > maxStray {
				maxStray = st.Stray
			}
		}
	}
	r.waitAll(40 * time.Second)
	rep := r.check(history.Options{})

	// Drain: take every valid token, then one more TryAcquire pops and drops
	// whatever strays remain; give the tokens back.
	var held []*redsem.Lease
	for i := 0; i < n; i++ {
		l, err := sem.TryAcquire(ctxT(t, 5*time.Second))
		require.NoError(t, err)
		held = append(held, l)
	}
	_, err = sem.TryAcquire(ctxT(t, 5*time.Second))
	assert.True(t, errors.Is(err, redsem.ErrNoToken), "an (N+1)th token: %v", err)
	for _, l := range held {
		require.NoError(t, l.Release(ctxT(t, 5*time.Second)))
	}
	final, lost, _ := quiesce(t, r.ops(), sem, 5*time.Second)
	total := pushed["forged"] + pushed["duplicate"] + pushed["garbage"]
	t.Logf("rogue tokens: clients=%d pushed=%v (total %d) max stray seen=%d rejected=%d %s; tokens lost=%d",
		len(r.procs), pushed, total, maxStray, final.Rejected, rep.Summary(), lost)
	assert.GreaterOrEqual(t, final.Rejected, int64(pushed["forged"]+pushed["garbage"]), "forged and garbage tokens must each be rejected")
	assert.LessOrEqual(t, rep.MaxOverlap, n)
}
