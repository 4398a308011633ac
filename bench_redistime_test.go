package redsem

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/floor"
	"github.com/redsem/redsem/internal/redistest"
)

// BenchmarkSemaphore_Acquire_redisTime measures the time Redis itself spends in the scripts of
// an uncontended Acquire+Release pair on a real redis-server, from INFO
// commandstats (cmdstat_evalsha): the figure to watch when a script grows.
// The floor= rows measure pairs that are not redsem's in the same run (see
// floor.All), so that the pair's µs can be read against them.
//
//	go test -run '^$' -bench Semaphore_Acquire_redisTime -benchtime 20000x -count 5 .
//
// idle=off is the default; idle=on is WithIdleExpiry, where every pair
// leaves the semaphore idle (its release sets the expiry, the next acquire
// removes it). busy=8 runs the default pair from 8 goroutines at once, each
// on a semaphore of its own: a Redis that is never idle between commands
// runs them on warm caches, so its µs per pair are lower than one client's
// (whose Redis sleeps between every two commands); the commands per pair
// are the same.
//
// evalsha-us/call is Redis's usec_per_call of EVALSHA (acquire.lua and
// release.lua averaged); redis-us/op is the EVALSHA time of one pair;
// script-cmds/op counts the commands the two scripts ran (commandstats
// counts a script's commands too): a figure that does not depend on how
// loaded the machine is.
func BenchmarkSemaphore_Acquire_redisTime(b *testing.B) {
	srv := redistest.Start(b)
	pool := newPool(b, srv.Addr)
	for _, bc := range []struct {
		name    string
		clients int
		opts    []Option
	}{
		{"idle=off", 1, nil},
		{"idle=on", 1, []Option{WithIdleExpiry(time.Minute)}},
		{"busy=8", 8, nil},
	} {
		b.Run(bc.name, func(b *testing.B) { benchRedisTime(b, srv.Addr, pool, bc.clients, bc.opts) })
	}
	for _, f := range floor.All() {
		b.Run("floor="+f.Name, func(b *testing.B) { benchRedisFloor(b, srv.Addr, f) })
	}
}

// benchRedisFloor measures one of floor.All like benchRedisTime
// measures redsem's pair: redis-us/op is the Redis time of its top-level
// commands; script-cmds/op counts the commands its scripts ran.
func benchRedisFloor(b *testing.B, addr string, f floor.Floor) {
	conn, err := redis.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := floor.Setup(conn); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 100; i++ { // load the scripts
		if err := f.Pair(conn); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Do("CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := f.Pair(conn); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	info, err := redis.String(conn.Do("INFO", "commandstats"))
	if err != nil {
		b.Fatal(err)
	}
	var usec, top float64
	for _, cmd := range f.Top {
		calls, u := commandStat(info, cmd)
		if calls < float64(b.N) {
			b.Fatalf("%s: %v calls of %s for %d pairs:\n%s", f.Name, calls, cmd, b.N, info)
		}
		usec += u
		if cmd != "evalsha" {
			top += calls
		}
	}
	b.ReportMetric(usec/float64(b.N), "redis-us/op")
	b.ReportMetric((scriptCommands(info)-top)/float64(b.N), "script-cmds/op")
}

func benchRedisTime(b *testing.B, addr string, pool Pool, clients int, opts []Option) {
	ctx := context.Background()
	sems := make([]*Semaphore, clients)
	for c := range sems {
		s, err := NewSemaphore(pool, fmt.Sprintf("redistime-%s-%d", b.Name(), c), 4, opts...)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 100; i++ { // load the scripts, create the semaphore
			l, err := s.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		sems[c] = s
	}
	admin, err := redis.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Do("CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make([]error, clients)
	for c, s := range sems {
		wg.Add(1)
		go func() { // client c runs pairs c, c+clients, ... of b.N
			defer wg.Done()
			for i := c; i < b.N && errs[c] == nil; i += clients {
				var l *Lease
				if l, errs[c] = s.Acquire(ctx); errs[c] == nil {
					errs[c] = l.Release(ctx)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	info, err := redis.String(admin.Do("INFO", "commandstats"))
	if err != nil {
		b.Fatal(err)
	}
	calls, usec := commandStat(info, "evalsha")
	if calls == 0 {
		b.Fatalf("no EVALSHA in commandstats:\n%s", info)
	}
	if b.N >= 1000 {
		b.Logf("per pair: %s", commandsPerOp(info, b.N))
	}
	b.ReportMetric(usec/calls, "evalsha-us/call")
	b.ReportMetric(usec/float64(b.N), "redis-us/op")
	b.ReportMetric(scriptCommands(info)/float64(b.N), "script-cmds/op")
}

// scriptCommands sums the calls of every command in an INFO commandstats
// reply but EVALSHA itself and the benchmark's own INFO and RESETSTAT.
func scriptCommands(info string) float64 {
	var n float64
	for _, line := range strings.Split(info, "\n") {
		name, _, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(strings.TrimSpace(line), "cmdstat_") || name == "evalsha" || name == "info" || name == "config|resetstat" {
			continue
		}
		calls, _ := commandStat(info, name)
		n += calls
	}
	return n
}

// commandStat returns the calls and total usec of cmd in an INFO
// commandstats reply.
func commandStat(info, cmd string) (calls, usec float64) {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = f
			case "usec":
				usec = f
			}
		}
	}
	return calls, usec
}

// commandsPerOp lists each command of an INFO commandstats reply with its
// calls per op and usec_per_call.
func commandsPerOp(info string, n int) string {
	var out []string
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, ":")
		calls, usec := commandStat(info, name)
		out = append(out, fmt.Sprintf("%s %.2f×%.2fµs", name, calls/float64(n), usec/calls))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
