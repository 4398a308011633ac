package rate_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/rate"
)

// exampleRedis starts an in-process Redis for the examples; use your own.
func exampleRedis() (addr string, stop func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	return m.Addr(), m.Close
}

// Call an external API at most 2 times per 100ms, across every process:
// Wait blocks until a start is allowed.
func ExampleGate() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	gate, err := rate.New(pool, "partner-api", 2, 100*time.Millisecond)
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
func ExampleGate_Allow() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	gate, _ := rate.New(pool, "sms-provider", 1, time.Minute)
	ctx := context.Background()
	_, err := gate.Allow(ctx)
	fmt.Println("first message sent:", err == nil)
	_, err = gate.Allow(ctx)
	var limited *rate.LimitedError
	if errors.As(err, &limited) {
		fmt.Println("429 Too Many Requests, Retry-After:", math.Ceil(limited.RetryAfter.Seconds()))
	}
	// Output:
	// first message sent: true
	// 429 Too Many Requests, Retry-After: 60
}
