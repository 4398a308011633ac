package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

// Share 8 GPU slots between jobs of different sizes: a training job takes 6
// at once, all or nothing, and small jobs that come later wait behind it
// instead of starving it.
func ExampleSemaphore_AcquireN() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()

	gpus, _ := redsem.NewSemaphore(pool, "gpus", 8)
	ops, _ := admin.New(pool, redsem.DefaultPrefix, "gpus") // to watch it
	ctx := context.Background()
	small, _ := gpus.AcquireN(ctx, 3) // a small job holds 3 slots

	// The training job needs 6: it collects the 5 free ones and waits for
	// one more, holding the head of the queue.
	trained := make(chan *redsem.Lease)
	go func() {
		big, err := gpus.AcquireN(ctx, 6)
		if err != nil {
			fmt.Println("acquire:", err)
		}
		trained <- big
	}()
	for st, _ := ops.Status(ctx); len(st.Holders) < 8; st, _ = ops.Status(ctx) {
		time.Sleep(time.Millisecond) // until it holds the 5 free slots
	}
	_, err := gpus.TryAcquire(ctx)
	fmt.Println("a later 1-slot job must wait:", errors.Is(err, redsem.ErrNoToken))

	small.Release(ctx) // its slots go to the training job first
	big := <-trained
	fmt.Println("training job holds", len(big.Tokens()), "slots")

	st, _ := ops.Status(ctx)
	fmt.Println("free slots left:", st.Available)
	big.Release(ctx)
	// Output:
	// a later 1-slot job must wait: true
	// training job holds 6 slots
	// free slots left: 2
}
