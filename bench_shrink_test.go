package redsem

import (
	"context"
	"math/rand"
	"sort"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
	"github.com/redsem/redsem/internal/redistest"
)

// BenchmarkLease_Release_shrinkRedisTime measures the time Redis spends in one
// Release while a shrink drains, against a Release with no shrink, on a
// real redis-server: a semaphore of 10,000 tokens, all held, then
// (shrinking) resized to 5,000, then every lease released one by one in a
// shuffled order. Each release's script time is read from INFO
// commandstats around it, so the maximum is a single release's, not an
// average.
//
//	go test -run '^$' -bench Lease_Release_shrinkRedisTime -benchtime 1x -count 3 .
//
// mean-us/release, p99-us/release and max-us/release cover the releases
// while the shrink drains (up to the last retired lease; in steady, all of
// them); resize-us is the Resize itself. The maximum is the figure most
// exposed to a loaded machine: compare p99 and mean first.
func BenchmarkLease_Release_shrinkRedisTime(b *testing.B) {
	const size, shrinkTo = 10000, 5000
	srv := redistest.Start(b)
	pool := newPool(b, srv.Addr)
	admin, err := redis.Dial("tcp", srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	for _, sc := range []*engine.Script{engine.Release.Script, engine.Resize.Script} {
		if err := sc.Load(admin); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		to   int // 0: no shrink
	}{{"steady", 0}, {"shrinking", shrinkTo}} {
		b.Run(bc.name, func(b *testing.B) {
			var times, resizes []float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				s, err := NewSemaphore(pool, "shrinkbench-"+engine.NewAcqID(), size, WithFixedTTL(), WithTTL(time.Hour))
				if err != nil {
					b.Fatal(err)
				}
				leases := make([]*Lease, 0, size)
				for len(leases) < size {
					l, err := s.TryAcquire(ctx)
					if err != nil {
						b.Fatal(err)
					}
					leases = append(leases, l)
				}
				if bc.to > 0 {
					resizes = append(resizes, scriptTime(b, admin, func() error { return s.Resize(ctx, bc.to) }))
				}
				rand.New(rand.NewSource(int64(i))).Shuffle(len(leases), func(a, c int) {
					leases[a], leases[c] = leases[c], leases[a]
				})
				// The shrink drains until the last retired lease is released.
				draining := len(leases)
				if bc.to > 0 {
					for j, l := range leases {
						if slotOf(b, l.Token()) > bc.to {
							draining = j + 1
						}
					}
				}
				for _, l := range leases[:draining] {
					times = append(times, scriptTime(b, admin, func() error { return l.Release(ctx) }))
				}
				for _, l := range leases[draining:] {
					if err := l.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			sort.Float64s(times)
			var sum float64
			for _, d := range times {
				sum += d
			}
			b.ReportMetric(sum/float64(len(times)), "mean-us/release")
			b.ReportMetric(times[len(times)*99/100], "p99-us/release")
			b.ReportMetric(times[len(times)-1], "max-us/release")
			if len(resizes) > 0 {
				sort.Float64s(resizes)
				b.ReportMetric(resizes[len(resizes)-1], "resize-us")
			}
		})
	}
}

// evalshaUsec returns the calls and total µs of EVALSHA so far, from INFO
// commandstats.
func evalshaUsec(b *testing.B, admin redis.Conn) (calls, usec float64) {
	b.Helper()
	info, err := redis.String(admin.Do("INFO", "commandstats"))
	if err != nil {
		b.Fatal(err)
	}
	return commandStat(info, "evalsha")
}

// scriptTime runs one script call and returns the µs Redis spent in it, the
// difference of EVALSHA's total time in INFO commandstats (which counts
// nothing else: the commands a script runs have their own lines). The script
// must be loaded already, so that the call is one EVALSHA.
func scriptTime(b *testing.B, admin redis.Conn, run func() error) float64 {
	b.Helper()
	calls0, usec0 := evalshaUsec(b, admin)
	b.StartTimer()
	err := run()
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	calls, usec := evalshaUsec(b, admin)
	if calls != calls0+1 {
		b.Fatalf("%v EVALSHA calls, want 1", calls-calls0)
	}
	return usec - usec0
}
