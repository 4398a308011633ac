package gocronlock

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
)

func TestMain(m *testing.M) {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
	goleak.VerifyTestMain(m)
}

// TestLocker_oneRunAtATime: three schedulers (three replicas) fire the
// same job every 20ms; it runs for several lock TTLs each time, and never
// on two replicas at once: its lock refreshes itself rather than expire
// mid-job.
func TestLocker_oneRunAtATime(t *testing.T) {
	srv := redistest.Start(t)
	// A TTL a loaded machine still refreshes in time (every third of it).
	const ttl = 250 * time.Millisecond
	var running, peak, runs, skipped atomic.Int64
	job := func() {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(3 * ttl)
		running.Add(-1)
		runs.Add(1)
	}
	var scheds []gocron.Scheduler
	for i := 0; i < 3; i++ {
		l, err := New(srv.Pool(t), 0, redsem.WithTTL(ttl))
		require.NoError(t, err)
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
		require.NoError(t, err)
		_, err = s.NewJob(gocron.DurationJob(20*time.Millisecond), gocron.NewTask(job), gocron.WithName("report"),
			gocron.WithEventListeners(gocron.AfterLockError(func(uuid.UUID, string, error) { skipped.Add(1) })))
		require.NoError(t, err)
		s.Start()
		scheds = append(scheds, s)
	}
	require.Eventually(t, func() bool { return runs.Load() >= 3 && skipped.Load() >= 3 }, 20*time.Second, 10*time.Millisecond)
	for _, s := range scheds {
		require.NoError(t, s.Shutdown())
	}
	assert.Equal(t, int64(1), peak.Load(), "the job ran on two replicas at once")
}

// TestLocker_minHold: a lock taken and unlocked at once stays held for
// minHold, so a replica firing a little later skips the run, and is given
// back afterwards.
func TestLocker_minHold(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, err := New(srv.Pool(t), 200*time.Millisecond)
	require.NoError(t, err)
	b, err := New(srv.Pool(t), 0)
	require.NoError(t, err)
	k, err := a.Lock(ctx, "report")
	require.NoError(t, err)
	require.NoError(t, k.Unlock(ctx))
	_, err = b.Lock(ctx, "report")
	require.ErrorIs(t, err, redsem.ErrNoToken, "held for minHold after the job ended")
	require.Eventually(t, func() bool {
		k, err := b.Lock(ctx, "report")
		if err != nil {
			return false
		}
		require.NoError(t, k.Unlock(ctx))
		return true
	}, 10*time.Second, 10*time.Millisecond, "released once minHold has passed")
}

// TestLocker_redisDownSkips: with Redis unreachable Lock fails, so gocron
// skips the run on this replica.
func TestLocker_redisDownSkips(t *testing.T) {
	srv := redistest.Start(t)
	l, err := New(srv.Pool(t), 0)
	require.NoError(t, err)
	srv.Kill()
	k, err := l.Lock(context.Background(), "report")
	require.Error(t, err)
	assert.Nil(t, k)
}
