package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/cluster"
	"github.com/redsem/redsem/internal/redistest"
)

// BenchmarkScaling runs 300 semaphores of size 2 under load (64 client
// goroutines, each acquiring a random semaphore and releasing it at once)
// on a cluster of 1 master and on one of 3 masters, through the same
// cluster.Pool. Compare acquire+release pairs/s:
//
//	go test ./cluster -run '^$' -bench Scaling -benchtime 5s
func BenchmarkScaling(b *testing.B) {
	for _, masters := range []int{1, 3} {
		c := redistest.StartCluster(b, masters, 0)
		p := newPool(b, c)
		var sems []*redsem.Semaphore
		for i := 0; i < 300; i++ {
			s, err := redsem.NewSemaphore(p, fmt.Sprintf("bench%d", i), 2)
			if err != nil {
				b.Fatal(err)
			}
			sems = append(sems, s)
		}
		b.Run(fmt.Sprintf("masters=%d", masters), func(b *testing.B) {
			benchPairs(b, c, p, sems)
		})
	}
}

func benchPairs(b *testing.B, c *redistest.Cluster, p *cluster.Pool, sems []*redsem.Semaphore) {
	b.SetParallelism(32) // 64 goroutines on 2 cores
	srv0, cli0 := serverCPU(b, c), clientCPU()
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			s := sems[rand.IntN(len(sems))]
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
	wall := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N)/wall, "pairs/s")
	// CPU seconds per wall second, in cores: what the servers and this
	// client process used of the machine's 2.
	b.ReportMetric((serverCPU(b, c)-srv0)/wall, "server-cores")
	b.ReportMetric((clientCPU()-cli0)/wall, "client-cores")
	_ = p
}

// serverCPU sums used_cpu_user and used_cpu_sys of the cluster's nodes.
func serverCPU(b *testing.B, c *redistest.Cluster) float64 {
	var sum float64
	for _, s := range c.Nodes {
		conn, err := redis.Dial("tcp", s.Addr)
		if err != nil {
			b.Fatal(err)
		}
		info, err := redis.String(conn.Do("INFO", "cpu"))
		conn.Close()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			k, v, _ := strings.Cut(line, ":")
			if k == "used_cpu_user" || k == "used_cpu_sys" {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
	}
	return sum
}

func clientCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
