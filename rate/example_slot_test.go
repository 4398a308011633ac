package rate_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/rate"
)

// At most 2 calls in flight and at most 10 starts per second: a semaphore's
// slot first, then a start; WaitHolding gives the slot back when no start
// comes.
func ExampleGate_WaitHolding() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 16, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	inFlight, _ := redsem.NewSemaphore(pool, "geo-api", 2)
	perSecond, _ := rate.New(pool, "geo-api", 10, time.Second)

	ctx := context.Background()
	var running, most atomic.Int32
	var wg sync.WaitGroup
	for job := 0; job < 6; job++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slot, err := inFlight.Acquire(ctx)
			if err != nil {
				fmt.Println("acquire:", err)
				return
			}
			if _, err := perSecond.WaitHolding(ctx, slot); err != nil {
				fmt.Println("wait:", err) // the slot was given back
				return
			}
			defer slot.Release(ctx)
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(10 * time.Millisecond) // the call
			running.Add(-1)
		}()
	}
	wg.Wait()
	fmt.Println("at most 2 in flight:", most.Load() <= 2)
	// Output: at most 2 in flight: true
}
