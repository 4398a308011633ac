package redsem_test

import (
	"context"
	"fmt"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
)

// Exactly one scheduler runs: the others campaign and wait their turn, and
// anyone can ask who leads or watch it change.
func ExampleElection() {
	addr, stop := exampleRedis()
	defer stop()
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	ctx := context.Background()

	election, err := redsem.NewElection(pool, "scheduler")
	if err != nil {
		panic(err)
	}
	changes := make(chan redsem.Leader, 10)
	watch, stopWatching := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- election.Observe(watch, func(l redsem.Leader) { changes <- l }) }()
	fmt.Printf("first seen: %q\n", (<-changes).Value)

	lead, err := election.Campaign(ctx, "host-a")
	if err != nil {
		panic(err)
	}
	// Run the scheduler under lead.Context(), and pass lead.Term() to
	// whatever it writes to, so that a stalled old leader is refused.
	fmt.Printf("leads: %q\n", (<-changes).Value)
	now, _ := election.Leader(ctx)
	fmt.Println("Leader reports the same term:", now.Term == lead.Term())

	lead.Proclaim(ctx, "host-a, v2")
	fmt.Printf("proclaimed: %q\n", (<-changes).Value)
	lead.Resign(ctx)
	fmt.Println("after resigning, term:", (<-changes).Term)

	next, _ := election.Campaign(ctx, "host-b")
	fmt.Println("the next term is greater:", next.Term() > lead.Term())
	next.Resign(ctx)
	stopWatching()
	<-watched
	// Output:
	// first seen: ""
	// leads: "host-a"
	// Leader reports the same term: true
	// proclaimed: "host-a, v2"
	// after resigning, term: 0
	// the next term is greater: true
}
