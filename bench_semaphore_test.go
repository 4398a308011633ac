package redsem

import (
	"context"
	"fmt"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/redsem/redsem/internal/redistest"
)

// Micro-benchmarks of the public API on miniredis and on a real
// redis-server, with client round trips per operation:
//
//	go test -run '^$' -bench . -count 6 . | tee new.txt   # compare with benchstat
//
// The comparison with the Redis round trip and with other libraries lives
// in bench/, its own module.

// benchBackends returns the address of a miniredis and of a real
// redis-server (if one is on PATH) for a benchmark.
func benchBackends(b *testing.B) map[string]string {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.Close)
	addrs := map[string]string{"miniredis": m.Addr()}
	addrs["redis"] = redistest.Start(b).Addr
	return addrs
}

func BenchmarkSemaphore_Acquire_uncontended(b *testing.B) {
	for _, backend := range []string{"miniredis", "redis"} {
		for _, op := range []string{"Acquire+Release", "TryAcquire+Release", "AcquireN(2)+Release"} {
			b.Run(fmt.Sprintf("%s/%s", backend, op), func(b *testing.B) {
				addr := benchBackends(b)[backend]
				cp := &countPool{Pool: newPool(b, addr)}
				s, err := NewSemaphore(cp, "bench", 4)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				acquire := map[string]func() (*Lease, error){
					"Acquire+Release":     func() (*Lease, error) { return s.Acquire(ctx) },
					"TryAcquire+Release":  func() (*Lease, error) { return s.TryAcquire(ctx) },
					"AcquireN(2)+Release": func() (*Lease, error) { return s.AcquireN(ctx, 2) },
				}[op]
				for i := 0; i < 10; i++ { // load the scripts
					l, err := acquire()
					if err != nil {
						b.Fatal(err)
					}
					_ = l.Release(ctx)
				}
				before := cp.trips.Load()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					l, err := acquire()
					if err != nil {
						b.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(cp.trips.Load()-before)/float64(b.N), "roundtrips/op")
			})
		}
	}
}

// BenchmarkSemaphore_Acquire_contended runs goroutines against a semaphore of size 2 on a
// real redis-server, each with its own Semaphore (its own connection), so
// that most acquisitions wait in Redis.
func BenchmarkSemaphore_Acquire_contended(b *testing.B) {
	addr := redistest.Start(b).Addr
	cp := &countPool{Pool: newPool(b, addr)}
	ctx := context.Background()
	b.SetParallelism(4)
	before := cp.trips.Load()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		s, err := NewSemaphore(cp, "contended", 2)
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			l, err := s.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cp.trips.Load()-before)/float64(b.N), "roundtrips/op")
}
