package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// TestMemoryPerName measures what a semaphore costs Redis in memory, one
// per tenant over 100,000 names, on a redis-server of its own: used_memory
// deltas for names used once and left idle (without and with
// WithIdleExpiry), and for a held lease on each; and that the names used
// once with idle expiry leave no key once the idle time has passed. It runs
// only when asked (about two minutes on 2 cores):
//
//	cd bench && REDSEM_BENCH_MEMORY=1 go test -run MemoryPerName -v .
func TestMemoryPerName(t *testing.T) {
	if os.Getenv("REDSEM_BENCH_MEMORY") != "1" {
		t.Skip("set REDSEM_BENCH_MEMORY=1")
	}
	n := 100000
	if s := os.Getenv("REDSEM_BENCH_NAMES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server")
	}
	srv, err := startServer(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	pool := &redis.Pool{MaxIdle: 32, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", srv.Addr) }}
	defer pool.Close()
	c := pool.Get()
	defer c.Close()
	used := func() int64 {
		info, err := redis.String(c.Do("INFO", "memory"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory")
		return 0
	}
	// each runs f on every name of a prefix, 16 at a time.
	each := func(prefix string, opts []redsem.Option, f func(s *redsem.Semaphore) error) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := g; i < n; i += 16 {
					s, err := redsem.NewSemaphore(pool, fmt.Sprintf("tenant-%d", i), 3,
						append([]redsem.Option{redsem.WithPrefix(prefix), redsem.WithFixedTTL(), redsem.WithTTL(time.Hour)}, opts...)...)
					if err == nil {
						err = f(s)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	once := func(s *redsem.Semaphore) error {
		l, err := s.Acquire(ctx)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	keys := func(prefix string) int {
		count, cursor := 0, 0
		for {
			v, err := redis.Values(c.Do("SCAN", cursor, "MATCH", prefix+"*", "COUNT", 10000))
			if err != nil {
				t.Fatal(err)
			}
			cursor, _ = redis.Int(v[0], nil)
			ks, _ := redis.Strings(v[1], nil)
			count += len(ks)
			if cursor == 0 {
				return count
			}
		}
	}
	per := func(d int64) float64 { return float64(d) / float64(n) }

	// Load the scripts first: their memory is not the names'.
	saved := n
	n = 16
	each("warm:", nil, once)
	n = saved
	if _, err := c.Do("FLUSHDB"); err != nil {
		t.Fatal(err)
	}
	base := used()
	each("plain:", nil, once)
	idlePlain := used()
	t.Logf("%d names of size 3, used once, no idle expiry: %.0f bytes each, %d keys", n, per(idlePlain-base), keys("plain:"))

	idle := 30 * time.Second // longer than making them takes
	start := time.Now()
	each("idle:", []redsem.Option{redsem.WithIdleExpiry(idle)}, once)
	idleExp := used()
	t.Logf("%d names of size 3, used once, WithIdleExpiry: %.0f bytes each, %d keys (took %v)", n, per(idleExp-idlePlain), keys("idle:"), time.Since(start).Round(time.Millisecond))

	each("plain:", nil, func(s *redsem.Semaphore) error { _, err := s.Acquire(ctx); return err })
	held := used()
	t.Logf("a held lease on each of the %d idle names: %.0f bytes each", n, per(held-idleExp))

	time.Sleep(time.Until(start.Add(idle + 500*time.Millisecond)))
	for time.Since(start) < idle+60*time.Second {
		if keys("idle:") == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	left := keys("idle:")
	t.Logf("%v after the last use: %d keys left of the %d names with idle expiry; used_memory %+d bytes against before they were made (held leases aside)",
		time.Since(start).Round(time.Millisecond), left, n, used()-idlePlain-(held-idleExp))
	if left != 0 {
		t.Errorf("%d keys left", left)
	}
}
