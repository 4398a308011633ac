package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// exampleRedis stands in for your Redis server: an in-process miniredis.
func exampleRedis() (addr string, stop func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	return m.Addr(), m.Close
}

// Limit a pool of workers, across all your machines, to two at a time.
func Example() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{
		MaxIdle: 8,
		Dial:    func() (redis.Conn, error) { return redis.Dial("tcp", addr) },
	}
	defer pool.Close()

	sem, err := redsem.NewSemaphore(pool, "video-encoders", 2)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var running, most atomic.Int32
	var wg sync.WaitGroup
	for job := 0; job < 6; job++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := sem.Acquire(ctx)
			if err != nil {
				fmt.Println("acquire:", err)
				return
			}
			defer lease.Release(ctx)

			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(20 * time.Millisecond) // the work
			running.Add(-1)
		}()
	}
	wg.Wait()
	fmt.Println("most at once:", most.Load())
	// Output: most at once: 2
}

// Gate calls to an external API: serve when a slot is free, shed load when
// not.
func ExampleSemaphore_TryAcquire() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	gate, _ := redsem.NewSemaphore(pool, "partner-api", 1)
	ctx := context.Background()
	first, _ := gate.TryAcquire(ctx)
	_, err := gate.TryAcquire(ctx)
	fmt.Println("second caller busy:", errors.Is(err, redsem.ErrNoToken))
	first.Release(ctx)
	again, err := gate.TryAcquire(ctx)
	fmt.Println("after release:", err == nil)
	again.Release(ctx)
	// Output:
	// second caller busy: true
	// after release: true
}

// Wait for a slot, but not forever.
func ExampleSemaphore_Acquire() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	sem, _ := redsem.NewSemaphore(pool, "reports", 1)
	held, _ := sem.Acquire(context.Background())
	defer held.Release(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := sem.Acquire(ctx)
	fmt.Println("timed out:", errors.Is(err, context.DeadlineExceeded))
	// Output: timed out: true
}

// A mutex is a semaphore of size 1. Pass the fence to the resource you
// guard, so that it can refuse a holder that stalled past its lease.
func ExampleMutex() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	mu, _ := redsem.NewMutex(pool, "nightly-rollup", redsem.WithTTL(10*time.Second))
	ctx := context.Background()
	a, _ := mu.Lock(ctx)
	a.Release(ctx)
	b, _ := mu.Lock(ctx)
	defer b.Release(ctx)
	fmt.Println("fences increase:", b.Fence() > a.Fence())
	// Output: fences increase: true
}

// Learn that a lease is gone: Done is closed and Err says why. A fixed
// lease (WithFixedTTL) is not refreshed in the background: it ends after
// its TTL unless the holder calls Refresh.
func ExampleLease_Done() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	sem, _ := redsem.NewSemaphore(pool, "short-lease", 1, redsem.WithTTL(50*time.Millisecond), redsem.WithFixedTTL())
	lease, _ := sem.Acquire(context.Background())
	select {
	case <-lease.Done():
		fmt.Println("lease ended:", lease.Err())
	case <-time.After(time.Second):
		fmt.Println("still held")
	}
	// Output: lease ended: redsem: lease expired
}
