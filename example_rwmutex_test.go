package redsem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// Many jobs read the index at once; a rebuild runs alone, and readers that
// come after it wait behind it.
func ExampleRWMutex() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	ctx := context.Background()

	index, err := redsem.NewRWMutex(pool, "search-index")
	if err != nil {
		panic(err)
	}
	r1, _ := index.RLock(ctx)
	r2, _ := index.RLock(ctx) // readers share
	fmt.Println("two readers:", r1.Valid() && r2.Valid())

	_, err = index.TryLock(ctx)
	fmt.Println("a writer now:", errors.Is(err, redsem.ErrNoToken))

	r1.Release(ctx)
	r2.Release(ctx)
	w, err := index.Lock(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("writer's fence above the readers':", w.Fence() > r1.Fence() && w.Fence() > r2.Fence())
	_, err = index.TryRLock(ctx)
	fmt.Println("a reader now:", errors.Is(err, redsem.ErrNoToken))
	w.Release(ctx)
	// Output:
	// two readers: true
	// a writer now: true
	// writer's fence above the readers': true
	// a reader now: true
}
