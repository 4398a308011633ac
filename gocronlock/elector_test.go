package gocronlock

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/redistest"
)

// electorTTL is the electors' lease TTL in these tests: a killed leader
// is replaced within it, and a live one, refreshing every third of it,
// keeps its lease on a loaded machine.
const electorTTL = 5 * time.Second

// electorReplicaEnv carries the Redis address to TestElectorReplicaProcess.
const electorReplicaEnv = "GOCRONLOCK_ELECTOR_REPLICA"

// startReplica runs a scheduler whose job, every 20ms, appends id to the
// Redis list "runs", behind an Elector of the election "report"; stop
// shuts the scheduler down, then closes the Elector (resigning).
func startReplica(t *testing.T, pool redsem.Pool, id string) (stop func()) {
	t.Helper()
	el, err := NewElector(pool, "report", id, redsem.WithTTL(electorTTL))
	require.NoError(t, err)
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(el))
	require.NoError(t, err)
	_, err = s.NewJob(gocron.DurationJob(20*time.Millisecond), gocron.NewTask(func() {
		c, err := pool.GetContext(context.Background())
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Do("RPUSH", "runs", id)
	}))
	require.NoError(t, err)
	s.Start()
	return func() {
		require.NoError(t, s.Shutdown())
		require.NoError(t, el.Close())
	}
}

// TestElectorReplicaProcess is the replica TestElector_onlyTheLeaderRuns
// starts in a process of its own (and kills); otherwise it does nothing.
func TestElectorReplicaProcess(t *testing.T) {
	addr := os.Getenv(electorReplicaEnv)
	if addr == "" {
		t.Skip("run by TestElector_onlyTheLeaderRuns")
	}
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	startReplica(t, pool, "a")
	select {} // until killed
}

// TestElector_onlyTheLeaderRuns: replica a (a process of its own) leads
// and runs the job while b waits and runs nothing; a is killed and b takes
// over; c joins and runs nothing; b resigns (its scheduler shut down, its
// Elector closed) and c takes over. The list of runs is a's, then b's, then
// c's, never mixed.
func TestElector_onlyTheLeaderRuns(t *testing.T) {
	srv := redistest.Start(t)
	runs := func() []string {
		l, err := redis.Strings(srv.Do(t, "LRANGE", "runs", 0, -1), nil)
		require.NoError(t, err)
		return l
	}
	count := func(id string) int {
		n := 0
		for _, r := range runs() {
			if r == id {
				n++
			}
		}
		return n
	}
	eventually := func(cond func() bool, msg string) {
		t.Helper()
		require.Eventually(t, cond, 30*time.Second, 10*time.Millisecond, msg)
	}

	a := exec.Command(os.Args[0], "-test.run=^TestElectorReplicaProcess$")
	a.Env = append(os.Environ(), electorReplicaEnv+"="+srv.Addr)
	require.NoError(t, a.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = a.Process.Kill()
			_ = a.Wait()
		}
	})
	eventually(func() bool { return count("a") > 0 }, "a leads and runs the job")

	stopB := startReplica(t, srv.Pool(t), "b")
	from := count("a")
	eventually(func() bool { return count("a") >= from+10 }, "a keeps running")
	require.Zero(t, count("b"), "b ran the job while a led")

	require.NoError(t, a.Process.Kill())
	_ = a.Wait()
	killed = true
	eventually(func() bool { return count("b") > 0 }, "b takes over from the killed leader")

	stopC := startReplica(t, srv.Pool(t), "c")
	from = count("b")
	eventually(func() bool { return count("b") >= from+10 }, "b keeps running")
	require.Zero(t, count("c"), "c ran the job while b led")

	stopB()
	eventually(func() bool { return count("c") > 0 }, "c takes over from the leader that resigned")
	stopC()

	got := runs()
	order := slices.Compact(slices.Clone(got))
	require.Equal(t, []string{"a", "b", "c"}, order, "the runs mix replicas: %s", strings.Join(got, ""))
}

// TestElector_isLeader: IsLeader is nil only while the Elector leads, and
// ErrNotLeader once it closed.
func TestElector_isLeader(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	el, err := NewElector(srv.Pool(t), "solo", "host-a")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return el.IsLeader(ctx) == nil }, 30*time.Second, 10*time.Millisecond)
	election, err := redsem.NewElection(srv.Pool(t), "gocron:solo")
	require.NoError(t, err)
	leader, err := election.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "host-a", leader.Value)
	require.NoError(t, el.Close())
	require.ErrorIs(t, el.IsLeader(ctx), ErrNotLeader)
	leader, err = election.Leader(ctx)
	require.NoError(t, err)
	require.Zero(t, leader.Term, "Close resigned")
}
