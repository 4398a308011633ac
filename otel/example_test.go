package otel_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/redsem/redsem"
	redsemotel "github.com/redsem/redsem/otel"
)

// A lease's wait and hold, as spans under the caller's span.
func ExampleNew() {
	m, err := miniredis.Run() // an in-process Redis for the example; use your own
	if err != nil {
		panic(err)
	}
	defer m.Close()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", m.Addr()) }}
	defer pool.Close()
	exp := tracetest.NewInMemoryExporter() // yours exports somewhere
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	sem, err := redsem.NewSemaphore(pool, "encoders", 2, redsem.WithObserver(redsemotel.New(tp, nil)))
	if err != nil {
		panic(err)
	}
	ctx, request := tp.Tracer("app").Start(context.Background(), "request")
	lease, err := sem.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	lease.Release(ctx)

	// The hold's span is recorded just after the lease ends, on a goroutine
	// of its own (as Observer.Released is).
	for i := 0; i < 10000 && len(exp.GetSpans()) < 2; i++ {
		time.Sleep(time.Millisecond)
	}
	request.End()
	for _, s := range exp.GetSpans() {
		fmt.Println(s.Name)
	}
	// Output:
	// redsem.wait
	// redsem.hold
	// request
}
