package grpcgate_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/redsem/redsem/grpcgate"
	"github.com/redsem/redsem/httpgate"
)

// At most one call a minute per method, across every replica of the
// server: the second call is refused with ResourceExhausted, and its
// RetryInfo says when the next start comes.
func ExampleUnaryServer() {
	m, err := miniredis.Run() // an in-process Redis for the example; use your own
	if err != nil {
		panic(err)
	}
	defer m.Close()
	pool := &redis.Pool{MaxIdle: 8, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", m.Addr()) }}
	defer pool.Close()

	lim, err := httpgate.New(pool, httpgate.Config{Name: "rpc", Limit: httpgate.Limit{N: 1, Per: time.Minute}})
	if err != nil {
		panic(err)
	}
	byMethod := func(_ context.Context, method string) string { return method }
	srv := grpc.NewServer(grpc.UnaryInterceptor(grpcgate.UnaryServer(lim, byMethod)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for i := 0; i < 2; i++ {
		resp, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			st := status.Convert(err)
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					fmt.Println(st.Code(), "retry in", ri.RetryDelay.AsDuration().Round(time.Minute))
				}
			}
			continue
		}
		fmt.Println(resp.Status)
	}
	// Output:
	// SERVING
	// ResourceExhausted retry in 1m0s
}
