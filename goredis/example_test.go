package goredis_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
	"github.com/redsem/redsem/goredis"
)

// addr is the Redis the examples use: a miniredis started by TestMain.
var addr string

func TestMain(m *testing.M) {
	// go-redis logs every Sentinel switch; the tests cause them on purpose.
	redis.SetLogger(quiet{})
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	addr = mr.Addr()
	code := m.Run()
	mr.Close()
	os.Exit(code)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...interface{}) {}

// A go-redis program that limits an encoder to two runs at a time across
// every process sharing the Redis.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr}) // your go-redis client
	defer rdb.Close()

	pool, err := goredis.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	sem, err := redsem.NewSemaphore(pool, "encoder", 2)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := sem.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	ops, err := admin.New(pool, redsem.DefaultPrefix, "encoder") // an operator's view
	if err != nil {
		log.Fatal(err)
	}
	st, err := ops.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("encoding; %d of %d slots free\n", st.Available, st.Size)
	// Output: encoding; 1 of 2 slots free
}

// A Redis Cluster through go-redis's ClusterClient, and a Sentinel
// failover client: both are redsem pools the same way.
func ExampleNew_cluster() {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"},
	})
	defer cluster.Close()
	pool, err := goredis.New(cluster)
	if err != nil {
		log.Fatal(err)
	}
	mu, err := redsem.NewMutex(pool, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	_ = mu

	failover := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "mymaster",
		SentinelAddrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"},
	})
	defer failover.Close()
	if pool, err = goredis.New(failover); err != nil {
		log.Fatal(err)
	}
	_ = pool
}
