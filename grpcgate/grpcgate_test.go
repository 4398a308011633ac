package grpcgate

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	health "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/httpgate"
	"github.com/redsem/redsem/internal/redistest"
)

func TestMain(m *testing.M) {
	// Tests must never pick up a developer's REDIS_URL or a Redis on 6379.
	os.Unsetenv("REDIS_URL")
	goleak.VerifyTestMain(m)
}

// service is a health server whose Check of service "hold" blocks until
// free is closed, whose Check of "until-cancelled" and Watch stay open
// until their context ends, reporting why.
type service struct {
	health.UnimplementedHealthServer
	entered chan struct{}
	free    chan struct{}
	ended   chan error
	served  atomic.Int64
}

func newService() *service {
	return &service{entered: make(chan struct{}, 8), free: make(chan struct{}), ended: make(chan error, 8)}
}

func (s *service) Check(ctx context.Context, req *health.HealthCheckRequest) (*health.HealthCheckResponse, error) {
	switch req.Service {
	case "hold":
		s.entered <- struct{}{}
		<-s.free
	case "until-cancelled":
		s.entered <- struct{}{}
		<-ctx.Done()
		s.ended <- context.Cause(ctx)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	s.served.Add(1)
	return &health.HealthCheckResponse{Status: health.HealthCheckResponse_SERVING}, nil
}

func (s *service) Watch(req *health.HealthCheckRequest, ws health.Health_WatchServer) error {
	if err := ws.Send(&health.HealthCheckResponse{Status: health.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	<-ws.Context().Done()
	s.ended <- context.Cause(ws.Context())
	return nil
}

// tenant is the key: the x-tenant metadata of the call.
func tenant(ctx context.Context, _ string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tenant"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// serve starts a gRPC server on loopback with svc behind the server
// interceptors of a Limiter of cfg, and returns a client of it.
func serve(t *testing.T, srv *redistest.Server, cfg httpgate.Config, svc *service, client ...grpc.DialOption) health.HealthClient {
	t.Helper()
	lim, err := httpgate.New(srv.Pool(t), cfg)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer(grpc.UnaryInterceptor(UnaryServer(lim, tenant)), grpc.StreamInterceptor(StreamServer(lim, tenant)))
	health.RegisterHealthServer(gs, svc)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client...)...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return health.NewHealthClient(conn)
}

func as(ctx context.Context, tn string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-tenant", tn)
}

// retryDelay is the RetryInfo delay of a status, or 0.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.RetryDelay.AsDuration()
		}
	}
	return 0
}

// TestServer_capsPerKey: with a tenant's one slot held by a unary call, or
// by an open stream, its next call fails with ResourceExhausted and a
// retry delay, another tenant is served, and the slot comes back when the
// call returns or the stream ends.
func TestServer_capsPerKey(t *testing.T) {
	srv := redistest.Start(t)
	svc := newService()
	c := serve(t, srv, httpgate.Config{Name: "rpc", Limit: httpgate.Limit{Slots: 1}}, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	held := make(chan error, 1)
	go func() {
		_, err := c.Check(as(ctx, "a"), &health.HealthCheckRequest{Service: "hold"})
		held <- err
	}()
	<-svc.entered
	_, err := c.Check(as(ctx, "a"), &health.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Equal(t, time.Second, retryDelay(err))
	_, err = c.Check(as(ctx, "b"), &health.HealthCheckRequest{})
	assert.NoError(t, err, "b is another key")
	close(svc.free)
	require.NoError(t, <-held)

	sctx, stop := context.WithCancel(as(ctx, "a"))
	ws, err := c.Watch(sctx, &health.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = ws.Recv()
	require.NoError(t, err)
	_, err = c.Check(as(ctx, "a"), &health.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "the open stream holds a's slot")
	stop()
	<-svc.ended
	require.Eventually(t, func() bool {
		_, err := c.Check(as(ctx, "a"), &health.HealthCheckRequest{})
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the stream's end gives the slot back")
}

// TestServer_lostLease: a stream whose lease is lost has its context
// cancelled, with the cause.
func TestServer_lostLease(t *testing.T) {
	srv := redistest.Start(t)
	svc := newService()
	// A TTL of a second, as in TestServer_lostLeaseUnary.
	c := serve(t, srv, httpgate.Config{Name: "rpc", Limit: httpgate.Limit{Slots: 1},
		Options: []redsem.Option{redsem.WithTTL(time.Second)}}, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, err := c.Watch(ctx, &health.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = ws.Recv()
	require.NoError(t, err)
	srv.Do(t, "FLUSHALL")
	assert.ErrorIs(t, <-svc.ended, redsem.ErrLeaseLost)
}

// TestServer_lostLeaseUnary: a unary call whose lease is lost has its
// context cancelled, with the cause, and fails.
func TestServer_lostLeaseUnary(t *testing.T) {
	srv := redistest.Start(t)
	svc := newService()
	// A TTL of a second: a loaded machine does not let it expire unrefreshed
	// before it is lost.
	c := serve(t, srv, httpgate.Config{Name: "rpc", Limit: httpgate.Limit{Slots: 1},
		Options: []redsem.Option{redsem.WithTTL(time.Second)}}, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	called := make(chan error, 1)
	go func() {
		_, err := c.Check(ctx, &health.HealthCheckRequest{Service: "until-cancelled"})
		called <- err
	}()
	<-svc.entered
	srv.Do(t, "FLUSHALL")
	select {
	case cause := <-svc.ended:
		assert.ErrorIs(t, cause, redsem.ErrLeaseLost, "cause %v", cause)
	case <-ctx.Done():
		t.Fatal("the call's context was not cancelled when its lease was lost")
	}
	assert.Error(t, <-called)
}

// TestServer_rateRetryInfo: a call refused by its key's rate gate carries
// the gate's figure as its retry delay, not the one-second floor: the
// next start comes a minute after the first.
func TestServer_rateRetryInfo(t *testing.T) {
	srv := redistest.Start(t)
	svc := newService()
	close(svc.free)
	c := serve(t, srv, httpgate.Config{Name: "rpc", Limit: httpgate.Limit{N: 1, Per: time.Minute}}, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Check(ctx, &health.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = c.Check(ctx, &health.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	// The ceiling is the window; the floor leaves the call up to 30s to
	// come back on a loaded machine.
	d := retryDelay(err)
	assert.True(t, d > 30*time.Second && d <= time.Minute, "retry delay %v: the gate's figure", d)
}

// TestServer_redisDown: with Redis unreachable a call fails with
// Unavailable and a retry delay of DownRetryAfter, or is served with
// FailOpen.
func TestServer_redisDown(t *testing.T) {
	for _, open := range []bool{false, true} {
		srv := redistest.Start(t)
		svc := newService()
		c := serve(t, srv, httpgate.Config{Name: "rpc", Limit: httpgate.Limit{Slots: 1, N: 10, Per: time.Second}, FailOpen: open}, svc)
		srv.Kill()
		_, err := c.Check(context.Background(), &health.HealthCheckRequest{})
		if open {
			assert.NoError(t, err)
		} else {
			assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			assert.Equal(t, httpgate.DownRetryAfter, retryDelay(err), "Unavailable carries a RetryInfo")
		}
	}
}

// TestUnaryClient: an outgoing call over its key's limit fails locally,
// never reaching the server, with ResourceExhausted and the gate's retry
// delay, and errors.As finds the *httpgate.FullError; a call whose context
// ends while it waits fails with its status and takes nothing.
func TestUnaryClient(t *testing.T) {
	srv := redistest.Start(t)
	svc := newService()
	close(svc.free)
	lim, err := httpgate.New(srv.Pool(t), httpgate.Config{Name: "out", Limit: httpgate.Limit{N: 2, Per: time.Minute}})
	require.NoError(t, err)
	c := serve(t, srv, httpgate.Config{Name: "in", Limit: httpgate.Limit{Slots: 100}}, svc, grpc.WithUnaryInterceptor(UnaryClient(lim, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		_, err := c.Check(ctx, &health.HealthCheckRequest{})
		require.NoError(t, err)
	}
	_, err = c.Check(ctx, &health.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Greater(t, retryDelay(err), time.Second)
	var full *httpgate.FullError
	assert.True(t, errors.As(err, &full))
	assert.Equal(t, int64(2), svc.served.Load(), "the refused call never went out")

	waits, err := httpgate.New(srv.Pool(t), httpgate.Config{Name: "waits", Limit: httpgate.Limit{Slots: 1}, Wait: -1})
	require.NoError(t, err)
	lease, err := waits.Acquire(ctx, "")
	require.NoError(t, err)
	wc := serve(t, srv, httpgate.Config{Name: "in2", Limit: httpgate.Limit{Slots: 100}}, svc, grpc.WithUnaryInterceptor(UnaryClient(waits, nil)))
	tctx, tcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer tcancel()
	_, err = wc.Check(tctx, &health.HealthCheckRequest{})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.NoError(t, lease.Release(ctx))
	_, err = wc.Check(ctx, &health.HealthCheckRequest{})
	assert.NoError(t, err, "the slot is free: the timed-out call took nothing")
}
