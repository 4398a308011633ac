package goredis_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/goredis"
	"github.com/redsem/redsem/internal/redistest"
)

// benchPools returns redigo's pool and the go-redis adapter (RESP3 and
// RESP2) on one redis-server started for the benchmark.
func benchPools(b *testing.B) map[string]redsem.Pool {
	s := redistest.Start(b)
	pools := map[string]redsem.Pool{"redigo": s.Pool(b)}
	for name, proto := range map[string]int{"goredis-resp3": 3, "goredis-resp2": 2} {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: proto})
		b.Cleanup(func() { c.Close() })
		p, err := goredis.New(c)
		if err != nil {
			b.Fatal(err)
		}
		pools[name] = p
	}
	return pools
}

// BenchmarkAcquireRelease is one uncontended Acquire and Release.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, name := range []string{"redigo", "goredis-resp3", "goredis-resp2"} {
		b.Run(name, func(b *testing.B) {
			pool := benchPools(b)[name]
			sem, err := redsem.NewSemaphore(pool, "bench", 1)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				l, err := sem.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCancelledAcquire cancels an Acquire blocked in Redis, b.N times,
// and reports how long Acquire took to return after the cancel: the median
// and the slowest, in ms. "own" waits on a connection of its own
// (WithWaitConnections(0)), "shared" behind the semaphore's shared wait.
func BenchmarkCancelledAcquire(b *testing.B) {
	for _, name := range []string{"redigo", "goredis-resp3"} {
		for _, mode := range []string{"own", "shared"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				pool := benchPools(b)[name]
				var opts []redsem.Option
				if mode == "own" {
					opts = append(opts, redsem.WithWaitConnections(0))
				}
				sem, err := redsem.NewSemaphore(pool, "bench-cancel", 1, opts...)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				held, err := sem.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					wctx, cancel := context.WithCancel(ctx)
					done := make(chan error, 1)
					go func() {
						_, err := sem.Acquire(wctx)
						done <- err
					}()
					time.Sleep(20 * time.Millisecond)
					cancel()
					at := time.Now()
					if err := <-done; err == nil {
						b.Fatal("acquired a held token")
					}
					lat = append(lat, time.Since(at))
				}
				b.StopTimer()
				_ = held.Release(ctx)
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
				b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
				b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
			})
		}
	}
}
