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

// A language-model API allows 500 requests and 200,000 tokens per minute,
// for every process of the service together. Each call takes one request
// and the tokens it may use (its prompt plus the most it may generate),
// from both limits at once or from neither.
func ExampleQuota() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	llm, err := rate.NewQuota(pool, "llm-api", []rate.Limit{
		{N: 500, Per: time.Minute},     // requests
		{N: 200_000, Per: time.Minute}, // tokens
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, tokens := range []int{60_000, 60_000, 60_000} {
		if _, err := llm.WaitN(ctx, 1, tokens); err != nil { // first come, first served
			fmt.Println("wait:", err)
			return
		}
		// call the model here
	}

	// 180,000 tokens used this minute: another large call would have to
	// wait. AllowN does not wait; it says when the call would fit.
	_, err = llm.AllowN(ctx, 1, 60_000)
	var limited *rate.LimitedError
	if errors.As(err, &limited) {
		fmt.Println("60,000 more tokens fit in about", limited.RetryAfter.Round(time.Minute))
	}
	_, err = llm.AllowN(ctx, 1, 20_000)
	fmt.Println("20,000 more tokens fit now:", err == nil)

	// A prompt above the whole minute's budget never fits: split it.
	_, err = llm.WaitN(ctx, 1, 250_000)
	fmt.Println("250,000 tokens at once:", errors.Is(err, rate.ErrTooLarge))

	// The provider raises the token limit: every client follows at once.
	err = llm.SetLimits(ctx, rate.Limit{N: 500, Per: time.Minute}, rate.Limit{N: 300_000, Per: time.Minute})
	if err != nil {
		panic(err)
	}
	_, err = llm.AllowN(ctx, 1, 60_000)
	fmt.Println("after the raise, 60,000 more fit:", err == nil)
	// Output:
	// 60,000 more tokens fit in about 1m0s
	// 20,000 more tokens fit now: true
	// 250,000 tokens at once: true
	// after the raise, 60,000 more fit: true
}
