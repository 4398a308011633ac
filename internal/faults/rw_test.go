package faults

import (
	"context"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/internal/faults/history"
	"github.com/redsem/redsem/internal/redistest"
)

// The read-write lock under every fault at once: readers and writers in
// separate processes (some cancelling most of their waits on purpose), killed
// with -9, frozen with SIGSTOP past the TTL, their connections cut with
// CLIENT KILL (blocked waiters and holders). The checker proves that no write
// hold overlapped another hold, that fences increased, and that nobody who
// waited patiently starved; afterwards the lock is free again within one TTL
// plus the grace.
func TestRWReadersAndWriters(t *testing.T) {
	t.Parallel()
	const ttl, grace = time.Second, 300 * time.Millisecond
	srv := redistest.Start(t)
	r := newRun(t, srv, 1, ttl, grace, "-rw", "-writep", "0.3", "-histname")
	runFor := scaled(6*time.Second, 10)
	end := time.Now().Add(runFor)
	common := []string{"-holdmin", "5ms", "-holdmax", "40ms", "-gapmax", "10ms"}
	spawn := func(i int) *proc {
		args := append([]string{"-dur", time.Until(end).Round(time.Millisecond).String()}, common...)
		if i%4 == 3 {
			args = append(args, "-storm", "-stormmax", "30ms")
		}
		return r.spawn(args...)
	}
	live := map[*proc]bool{}
	for i := 0; i < 8; i++ {
		live[spawn(i)] = true
	}
	admin, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Do("CLIENT", "SETNAME", "admin")
	require.NoError(t, err)

	faults := map[string]int{}
	for i := 0; time.Now().Before(end.Add(-1500*time.Millisecond)) && i < 10000; i++ {
		time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond)
		for p := range live {
			if p.exited() {
				delete(live, p)
				live[spawn(len(r.procs))] = true
			}
		}
		var victim *proc
		for p := range live {
			victim = p
			break
		}
		switch i % 3 {
		case 0:
			victim.kill9()
			delete(live, victim)
			live[spawn(len(r.procs))] = true
			faults["kill -9"]++
		case 1:
			var blocked []string
			for _, c := range clientList(t, admin) {
				if c["name"] != "hist" && c["name"] != "admin" && (c["cmd"] == "blpop" || strings.Contains(c["flags"], "b")) {
					blocked = append(blocked, c["id"])
				}
			}
			if len(blocked) > 0 {
				if _, err := admin.Do("CLIENT", "KILL", "ID", blocked[rand.IntN(len(blocked))]); err == nil {
					faults["CLIENT KILL of a blocked waiter"]++
				}
			}
		case 2:
			_ = syscall.Kill(victim.pid(), syscall.SIGSTOP)
			time.Sleep(ttl + ttl/2)
			_ = syscall.Kill(victim.pid(), syscall.SIGCONT)
			faults["SIGSTOP past the TTL"]++
		}
	}
	r.waitAll(40 * time.Second)
	rep := r.check(history.Options{RW: true})
	m, err := redsem.NewRWMutex(r.pool(), r.name, redsem.WithTTL(ttl), redsem.WithGrace(grace))
	require.NoError(t, err)
	// Free within a TTL plus the grace on a machine with time to spare (the
	// figure logged); the ceiling only tells a lock that never frees from
	// a loaded machine.
	took := rwQuiesce(t, r.ops(), m, 4*(ttl+grace)+10*time.Second)
	t.Logf("rwmutex under faults: clients=%d faults=%v %s; free again after %v", len(r.procs), faults, rep.Summary(), took.Round(time.Millisecond))
	assert.Positive(t, rep.Writes, "no write holds")
	assert.Greater(t, rep.MaxReaders, 1, "readers never shared the lock")
	assert.Positive(t, rep.Cancels, "no cancelled waits")
	for _, f := range []string{"kill -9", "CLIENT KILL of a blocked waiter", "SIGSTOP past the TTL"} {
		assert.Positive(t, faults[f], f)
	}
}

// rwQuiesce waits, at most bound, until the lock grants a write lease at
// once and its Status then shows nothing else held or queued, and returns
// how long that took.
func rwQuiesce(t *testing.T, ops *admin.Handle, m *redsem.RWMutex, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := m.TryLock(ctx)
		if err == nil {
			st, serr := ops.RWStatus(ctx)
			require.NoError(t, serr)
			assert.Empty(t, st.Readers)
			assert.Empty(t, st.Queue)
			require.NoError(t, l.Release(ctx))
			cancel()
			return time.Since(start)
		}
		cancel()
		require.ErrorIs(t, err, redsem.ErrNoToken)
		if !assert.Less(t, time.Since(start), bound, "the lock is still held or queued after the workers stopped") {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The checker must catch a broken read-write client: writers that take the
// read side (so they share the lock with readers and with each other) are
// write holds overlapping other holds.
func TestCheckerCatchesRWWriterTakingReadSide(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRun(t, srv, 1, time.Second, 200*time.Millisecond, "-rw")
	for i := 0; i < 3; i++ {
		r.spawn("-mode", "mut-rwread", "-writep", "0.5", "-dur", "3s", "-holdmin", "20ms", "-holdmax", "60ms", "-gapmax", "5ms")
	}
	for i := 0; i < 2; i++ {
		r.spawn("-dur", "3s", "-holdmin", "20ms", "-holdmax", "60ms", "-gapmax", "5ms")
	}
	r.waitAll(30 * time.Second)
	rep := history.Check(r.events(), history.Options{N: 1, RW: true})
	t.Logf("broken rw client: %s", rep.Summary())
	assert.Positive(t, rep.Kinds["rw"], "the checker missed a write hold overlapping another hold")
}
