package redsem

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/floor"
	"github.com/redsem/redsem/internal/redistest"
)

// An uncontended Acquire+Release runs 10 Redis commands inside its two
// scripts: acquire HMGET meta, TIME, HSET fence, LPOP, ZADD, HSET record;
// release HMGET holders, HDEL, LPUSH, ZREM (meta is read only with idle
// expiry on, flagged in holders). Counted by INFO commandstats on a real
// redis-server; BenchmarkSemaphore_Acquire_redisTime reports the same figure with its time.
// The floor "skeleton" (internal/floor), which BenchmarkSemaphore_Acquire_redisTime and
// bench/instructions measure as what those commands cost unchecked, must
// run the very same commands.
func TestSemaphore_Acquire_uncontendedPairRunsTenCommands(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := ctxT(t, 10*time.Second)
	tenCommands := map[string]float64{"hmget": 2, "time": 1, "hset": 2, "lpop": 1, "zadd": 1, "hdel": 1, "lpush": 1, "zrem": 1}
	for _, bc := range []struct {
		name string
		opts []Option
		want map[string]float64
	}{
		{"idle=off", nil, tenCommands},
		// Every pair leaves the semaphore idle: the release reads meta and
		// sets the expiry, the next acquire removes it.
		{"idle=on", []Option{WithIdleExpiry(time.Minute)}, nil},
		{"floor=skeleton", nil, tenCommands},
	} {
		t.Run(bc.name, func(t *testing.T) {
			var pair func()
			if name, ok := strings.CutPrefix(bc.name, "floor="); ok {
				pair = floorPair(t, srv.Addr, name)
			} else {
				s, err := NewSemaphore(srv.Pool(t), "paircost-"+bc.name, 4, bc.opts...)
				require.NoError(t, err)
				pair = func() {
					l, err := s.Acquire(ctx)
					require.NoError(t, err)
					require.NoError(t, l.Release(ctx))
				}
			}
			for i := 0; i < 10; i++ { // create it, load the scripts
				pair()
			}
			admin, err := redis.Dial("tcp", srv.Addr)
			require.NoError(t, err)
			defer admin.Close()
			_, err = admin.Do("CONFIG", "RESETSTAT")
			require.NoError(t, err)
			const n = 50
			for i := 0; i < n; i++ {
				pair()
			}
			info, err := redis.String(admin.Do("INFO", "commandstats"))
			require.NoError(t, err)
			// Every command but the test's own, per pair.
			got := map[string]float64{}
			inner := 0.0
			for name, calls := range commandCalls(info) {
				got[name] = calls / n
				if name != "evalsha" {
					inner += calls / n
				}
			}
			assert.Equal(t, 2.0, got["evalsha"], "EVALSHA calls per pair")
			if bc.want == nil {
				assert.Equal(t, 22.0, inner, "commands inside the scripts per pair: %v", got)
				return
			}
			assert.Equal(t, 10.0, inner, "commands inside the scripts per pair: %v", got)
			for cmd, per := range bc.want {
				assert.Equal(t, per, got[cmd], "%s per pair", cmd)
			}
		})
	}
}

// commandCalls returns the calls of every command in an INFO commandstats
// reply but the tests' own INFO and CONFIG.
func commandCalls(info string) map[string]float64 {
	got := map[string]float64{}
	for _, line := range strings.Split(info, "\n") {
		name, _, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(strings.TrimSpace(line), "cmdstat_") ||
			name == "info" || strings.HasPrefix(name, "config") {
			continue
		}
		got[name], _ = commandStat(info, name)
	}
	return got
}

// floorPair returns a function that runs the floor.All pair called name
// once, on a connection of its own to addr, after floor.Setup.
func floorPair(t *testing.T, addr, name string) func() {
	conn, err := redis.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	require.NoError(t, floor.Setup(conn))
	for _, f := range floor.All() {
		if f.Name == name {
			return func() { require.NoError(t, f.Pair(conn)) }
		}
	}
	t.Fatalf("no floor %q", name)
	return nil
}

// A contended acquisition runs at most 12 Redis commands inside its
// scripts (issue 12): its first script registers it (HMGET meta, TIME, HSET
// fence, LPOP finding nothing, ZADD waits), then BLMOVE, then the script
// behind it grants (HMGET meta, TIME, LPOP pending, ZADD lease, HSET
// record, ZREM waits, HSET fence). Counted with the holder's release (4
// commands) that hands it the token.
func TestSemaphore_Acquire_contendedRunsTwelveCommands(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := ctxT(t, 20*time.Second)
	s, err := NewSemaphore(srv.Pool(t), "paircost-contended", 1)
	require.NoError(t, err)
	for i := 0; i < 10; i++ { // create it, load the scripts
		l, err := s.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	admin, err := redis.Dial("tcp", srv.Addr)
	require.NoError(t, err)
	defer admin.Close()
	// Each round is counted on its own, and each command judged by its
	// median round: a round on a loaded machine may take a detour (a
	// waiter woken and blocked again) that the protocol allows.
	const n = 11
	rounds := make([]map[string]float64, n)
	for i := 0; i < n; i++ {
		held, err := s.Acquire(ctx)
		require.NoError(t, err)
		_, err = admin.Do("CONFIG", "RESETSTAT")
		require.NoError(t, err)
		granted := make(chan *Lease, 1)
		go func() {
			l, err := s.Acquire(ctx)
			assert.NoError(t, err)
			granted <- l
		}()
		require.Eventually(t, func() bool {
			info, err := redis.String(admin.Do("INFO", "clients"))
			return err == nil && strings.Contains(info, "blocked_clients:1\r\n")
		}, 5*time.Second, time.Millisecond, "the waiter never blocked")
		require.NoError(t, held.Release(ctx))
		l := <-granted
		require.NotNil(t, l)
		info, err := redis.String(admin.Do("INFO", "commandstats"))
		require.NoError(t, err)
		rounds[i] = commandCalls(info)
		require.NoError(t, l.Release(ctx))
	}
	got := map[string]float64{}
	for _, r := range rounds {
		for name := range r {
			got[name] = 0
		}
	}
	for name := range got {
		per := make([]float64, n)
		for i, r := range rounds {
			per[i] = r[name]
		}
		sort.Float64s(per)
		got[name] = per[n/2]
	}
	assert.Equal(t, 3.0, got["evalsha"], "EVALSHA calls per contended acquisition and release: %v", got)
	assert.Equal(t, 1.0, got["blmove"], "BLMOVE calls: %v", got)
	inner := 0.0
	for name, per := range got {
		if name != "evalsha" && name != "blmove" {
			inner += per
		}
	}
	assert.LessOrEqual(t, inner-4, 12.0, "commands inside a contended acquisition's scripts: %v", got)
}
