package main

// Micro-benchmarks of redsem's public API against a real redis-server that
// TestMain starts on a free loopback port (and skips without one). Each
// reports round trips per operation, counted by a wrapper around the redigo
// pool, and Redis commands per operation from INFO commandstats (commands
// that scripts run included). Run with
//
//	cd bench && go test -run '^$' -bench . -count 6 | tee new.txt
//
// and compare runs with benchstat.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

var benchEnv *env

func TestMain(m *testing.M) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		fmt.Println("redis-server not on PATH: skipping the benchmarks")
		os.Exit(0)
	}
	srv, err := startServer(bin)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if benchEnv, err = newEnv(srv.Addr); err != nil {
		srv.close()
		fmt.Println(err)
		os.Exit(1)
	}
	code := m.Run()
	benchEnv.close()
	srv.close()
	os.Exit(code)
}

// measure runs f under the benchmark's timer and reports round trips,
// commands sent and Redis commands per op.
func measure(b *testing.B, c *counters, f func()) {
	b.Helper()
	rt0, cmd0 := c.snapshot()
	s0 := benchEnv.stats()
	b.ResetTimer()
	f()
	b.StopTimer()
	s1 := benchEnv.stats()
	rt1, cmd1 := c.snapshot()
	n := float64(b.N)
	b.ReportMetric(float64(rt1-rt0)/n, "roundtrips/op")
	b.ReportMetric(float64(cmd1-cmd0)/n, "sent-cmds/op")
	b.ReportMetric(float64(s1.calls-s0.calls)/n, "redis-cmds/op")
}

func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		size int
		op   func(b *testing.B, p *countingPool, s *redsem.Semaphore, key string)
	}{
		{"floor/PING", 1, func(b *testing.B, p *countingPool, _ *redsem.Semaphore, _ string) {
			conn, _ := p.GetContext(ctx)
			defer conn.Close()
			for b.Loop() {
				if _, err := conn.Do("PING"); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"floor/BLPOP+LPUSH", 1, func(b *testing.B, p *countingPool, _ *redsem.Semaphore, key string) {
			conn, _ := p.GetContext(ctx)
			defer conn.Close()
			if err := prepareRaw(conn, key, 1); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				v, err := redis.Strings(conn.Do("BLPOP", key, 0))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := conn.Do("LPUSH", key, v[1]); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"Mutex/Acquire+Release", 1, acquireRelease},
		{"Semaphore4/Acquire+Release", 4, acquireRelease},
		{"Mutex/TryAcquire+Release", 1, func(b *testing.B, _ *countingPool, s *redsem.Semaphore, _ string) {
			for b.Loop() {
				l, err := s.TryAcquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"Mutex/Acquire", 1, func(b *testing.B, p *countingPool, s *redsem.Semaphore, _ string) {
			half(b, p, s, true)
		}},
		{"Mutex/Release", 1, func(b *testing.B, p *countingPool, s *redsem.Semaphore, _ string) {
			half(b, p, s, false)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := &counters{}
			p := newRedigoPool(benchEnv.addr, c, false)
			defer p.Close()
			key := benchEnv.key("gotest", bc.name)
			s, err := redsem.NewSemaphore(p, key, bc.size)
			if err != nil {
				b.Fatal(err)
			}
			if bc.name[:5] != "floor" {
				l, err := s.Acquire(ctx) // create it, load the scripts
				if err != nil {
					b.Fatal(err)
				}
				l.Release(ctx)
			}
			if bc.name == "Mutex/Acquire" || bc.name == "Mutex/Release" {
				bc.op(b, p, s, key) // measures and reports itself
				return
			}
			measure(b, c, func() { bc.op(b, p, s, key) })
		})
	}
}

func acquireRelease(b *testing.B, _ *countingPool, s *redsem.Semaphore, _ string) {
	ctx := context.Background()
	for b.Loop() {
		l, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// half times and counts only Acquire (acquire true) or only Release.
func half(b *testing.B, p *countingPool, s *redsem.Semaphore, acquire bool) {
	ctx := context.Background()
	c := p.c
	var rt, cmds, calls int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		var l *redsem.Lease
		if !acquire {
			var err error
			if l, err = s.Acquire(ctx); err != nil {
				b.Fatal(err)
			}
		}
		rt0, cmd0 := c.snapshot()
		s0 := benchEnv.stats()
		b.StartTimer()
		if acquire {
			var err error
			if l, err = s.Acquire(ctx); err != nil {
				b.Fatal(err)
			}
		} else if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		s1 := benchEnv.stats()
		rt1, cmd1 := c.snapshot()
		rt, cmds, calls = rt+rt1-rt0, cmds+cmd1-cmd0, calls+s1.calls-s0.calls
		if acquire {
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(rt)/n, "roundtrips/op")
	b.ReportMetric(float64(cmds)/n, "sent-cmds/op")
	b.ReportMetric(float64(calls)/n, "redis-cmds/op")
}

// BenchmarkContended runs Acquire+Release from GOMAXPROCS*p goroutines that
// share one semaphore and one pool (a blocked Acquire holds a connection).
// The raw floor does the same with BLPOP and LPUSH on a token list.
func BenchmarkContended(b *testing.B) {
	ctx := context.Background()
	for _, size := range []int{1, 4} {
		for _, par := range []int{4, 32} {
			b.Run(fmt.Sprintf("floor/size%d/p%d", size, par), func(b *testing.B) {
				c := &counters{}
				p := newRedigoPool(benchEnv.addr, c, true)
				defer p.Close()
				key := benchEnv.key("gotest", "raw-contended")
				benchEnv.mu.Lock()
				err := prepareRaw(benchEnv.admin, key, size)
				benchEnv.mu.Unlock()
				if err != nil {
					b.Fatal(err)
				}
				lk := rawLocker{pool: p, key: key}
				b.SetParallelism(par)
				measure(b, c, func() {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							rel, err := lk.lock(ctx)
							if err != nil {
								b.Error(err)
								return
							}
							if err := rel(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			})
			b.Run(fmt.Sprintf("redsem/size%d/p%d", size, par), func(b *testing.B) {
				c := &counters{}
				p := newRedigoPool(benchEnv.addr, c, true)
				defer p.Close()
				s, err := redsem.NewSemaphore(p, benchEnv.key("gotest", "contended"), size)
				if err != nil {
					b.Fatal(err)
				}
				b.SetParallelism(par)
				measure(b, c, func() {
					b.RunParallel(func(pb *testing.PB) {
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
				})
			})
		}
	}
}
