package gocronlock_test

import (
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-co-op/gocron/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/google/uuid"

	"github.com/redsem/redsem/gocronlock"
)

// Two replicas schedule the same nightly report; it runs on one of them,
// and the other skips it.
func ExampleNew() {
	m, err := miniredis.Run() // an in-process Redis for the example; use your own
	if err != nil {
		panic(err)
	}
	defer m.Close()

	ran, skipped := make(chan string, 2), make(chan string, 2)
	for _, replica := range []string{"a", "b"} {
		pool := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", m.Addr()) }}
		defer pool.Close()
		// Held for at least a second, however short the run: a replica
		// whose schedule fires a little later skips it too.
		locker, err := gocronlock.New(pool, time.Second)
		if err != nil {
			panic(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			panic(err)
		}
		defer s.Shutdown()
		_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
			gocron.NewTask(func() { ran <- replica }),
			gocron.WithName("nightly-report"),
			gocron.WithEventListeners(gocron.AfterLockError(func(uuid.UUID, string, error) { skipped <- replica })))
		if err != nil {
			panic(err)
		}
		s.Start()
	}
	<-ran
	<-skipped
	fmt.Println("ran on one replica, skipped on the other")
	// Output: ran on one replica, skipped on the other
}

// Two replicas run the same scheduler; only the one that leads the
// election runs its jobs, and the other takes over when it stops.
func ExampleNewElector() {
	m, err := miniredis.Run() // an in-process Redis for the example; use your own
	if err != nil {
		panic(err)
	}
	defer m.Close()

	ran := make(chan string, 16)
	for _, replica := range []string{"a", "b"} {
		pool := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", m.Addr()) }}
		defer pool.Close()
		elector, err := gocronlock.NewElector(pool, "reports", replica) // replica: its host name, say
		if err != nil {
			panic(err)
		}
		defer elector.Close() // resigns: the other replica leads next
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
		if err != nil {
			panic(err)
		}
		defer s.Shutdown()
		_, err = s.NewJob(gocron.DurationJob(10*time.Millisecond), gocron.NewTask(func() {
			select {
			case ran <- replica:
			default:
			}
		}))
		if err != nil {
			panic(err)
		}
		s.Start()
	}
	leader := <-ran
	for i := 0; i < 5; i++ {
		if r := <-ran; r != leader {
			fmt.Println("a job ran on a replica that does not lead")
		}
	}
	fmt.Println("only the leader runs the jobs")
	// Output: only the leader runs the jobs
}
