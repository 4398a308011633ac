package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// Call an external API at most 2 times per 100ms, across every process:
// Wait blocks until a start is allowed.
func ExampleRateGate() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	gate, err := redsem.NewRateGate(pool, "partner-api", 2, 100*time.Millisecond)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	began := time.Now()
	for call := 1; call <= 5; call++ {
		if _, err := gate.Wait(ctx); err != nil {
			fmt.Println("wait:", err)
			return
		}
		// call the API here
	}
	// Calls 3 and 4 wait for the first two starts to come back, call 5
	// for the third.
	fmt.Println("5 calls took at least 200ms:", time.Since(began) >= 200*time.Millisecond)
	// Output: 5 calls took at least 200ms: true
}

// Shed load instead of waiting, and tell the client when to come back.
func ExampleRateGate_Allow() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	gate, _ := redsem.NewRateGate(pool, "sms-provider", 1, time.Minute)
	ctx := context.Background()
	_, err := gate.Allow(ctx)
	fmt.Println("first message sent:", err == nil)
	_, err = gate.Allow(ctx)
	var limited *redsem.RateLimitedError
	if errors.As(err, &limited) {
		fmt.Println("429 Too Many Requests, Retry-After:", math.Ceil(limited.RetryAfter.Seconds()))
	}
	// Output:
	// first message sent: true
	// 429 Too Many Requests, Retry-After: 60
}

// At most 2 calls in flight and at most 10 starts per second.
func ExampleGate() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	inFlight, _ := redsem.NewSemaphore(pool, "geo-api", 2)
	perSecond, _ := redsem.NewRateGate(pool, "geo-api", 10, time.Second)
	gate, _ := redsem.NewGate(inFlight, perSecond)

	ctx := context.Background()
	var running, most atomic.Int32
	var wg sync.WaitGroup
	for job := 0; job < 6; job++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pass, err := gate.Acquire(ctx)
			if err != nil {
				fmt.Println("acquire:", err)
				return
			}
			defer pass.Release(ctx)
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(10 * time.Millisecond) // the call
			running.Add(-1)
		}()
	}
	wg.Wait()
	fmt.Println("most in flight:", most.Load())
	// Output: most in flight: 2
}
