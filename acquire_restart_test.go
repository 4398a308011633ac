package redsem

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A waiter blocked while Redis restarts (without persistence, so the
// semaphore is gone) waits on through the outage: its broken connection is
// replaced once Redis answers again, and the next try re-creates the
// semaphore and grants. While Redis stays down, the wait lasts until its
// context ends, and says so.
func TestSemaphore_Acquire_waiterSurvivesRestart(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		if b.srv == nil {
			t.Skip("needs a redis-server to restart")
		}
		ctx := ctxT(t, 30*time.Second)
		s := newSem(t, b, "restart-wait", 2)
		type result struct {
			l   *Lease
			err error
		}
		wait := func(d time.Duration) <-chan result {
			holdN(t, ctx, s.Acquire, 2)
			done := make(chan result, 1)
			go func() {
				l, err := s.Acquire(ctxT(t, d))
				done <- result{l, err}
			}()
			require.Eventually(t, func() bool {
				list, _ := redis.String(b.do(t, "CLIENT", "LIST"), nil)
				return strings.Contains(list, "cmd=blmove")
			}, 10*time.Second, 5*time.Millisecond, "the waiter never blocked")
			return done
		}

		done := wait(20 * time.Second)
		b.srv.Restart() // --save "" --appendonly no: the data is gone
		r := <-done
		require.NoError(t, r.err, "the waiter gave up during the restart")
		require.NoError(t, r.l.Release(ctx))

		done = wait(5 * time.Second)
		b.srv.Kill()
		r = <-done
		require.ErrorIs(t, r.err, context.DeadlineExceeded, "Redis down until the wait's deadline")
		assert.NotContains(t, r.err.Error(), "settl")
	})
}
