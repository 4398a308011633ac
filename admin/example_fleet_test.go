package admin_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/rate"
)

// List every semaphore and rate gate under the default prefix with how
// busy each is, as redsem top does.
func ExampleReadFleet() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	ctx := context.Background()

	// Some other services' state.
	sem, _ := redsem.NewSemaphore(pool, "video-encoders", 4)
	a, _ := sem.TryAcquire(ctx)
	defer a.Release(ctx)
	b, _ := sem.TryAcquire(ctx)
	defer b.Release(ctx)
	gate, _ := rate.New(pool, "partner-api", 100, time.Minute)
	gate.Allow(ctx)

	fleet, err := admin.ReadFleet(ctx, pool, redsem.DefaultPrefix, admin.ScanLimits{})
	if err != nil {
		panic(err)
	}
	for _, st := range fleet.Semaphores {
		fmt.Printf("%s: %d of %d held, %d waiting, %d expired\n",
			st.Name, len(st.Holders), st.Size, st.Waiting, st.Expired())
	}
	for _, g := range fleet.RateGates {
		fmt.Printf("%s: %d of %d per %v started\n", g.Name, g.Started, g.Limit, g.Per)
	}
	// Output:
	// video-encoders: 2 of 4 held, 0 waiting, 0 expired
	// partner-api: 1 of 100 per 1m0s started
}

// exampleRedis starts an in-process Redis for the examples; use your own.
func exampleRedis() (addr string, stop func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	return m.Addr(), m.Close
}
