// Package grpcgate puts an httpgate.Limiter in front of gRPC: unary and
// stream server interceptors that take a slot and a start of the call's
// key before the handler runs and give the slot back when it returns, and a
// unary client interceptor that does the same around an outgoing call. The
// Limiter's Config is the same as for HTTP: per-key limits, Wait,
// FailOpen, idle expiry, MaxKeys.
//
// A full key fails the call with codes.ResourceExhausted carrying an
// errdetails.RetryInfo, the gate's figure or at least a second
// (Config.FullStatus is HTTP's only); Redis unreachable fails it with
// codes.Unavailable and a RetryInfo of httpgate.DownRetryAfter (1s),
// unless Config.FailOpen. If a call's lease is lost, its context is
// cancelled. It is a module of its own, so the root module never depends
// on gRPC; docs/middleware.md tells the rest.
package grpcgate

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/redsem/redsem/httpgate"
)

// Key picks a call's key from its context (metadata, peer) and its full
// method name ("/pkg.Service/Method"); nil puts every call under one key.
type Key func(ctx context.Context, method string) string

// UnaryServer returns a server interceptor that takes the call's key's
// slot and start (lim.Acquire) before handler runs, and gives the slot
// back when it returns.
func UnaryServer(lim *httpgate.Limiter, key Key) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
		ctx, end, err := hold(ctx, lim, key, info.FullMethod)
		if err != nil {
			return nil, err
		}
		defer end()
		return handler(ctx, req)
	}
}

// StreamServer returns a server interceptor that takes the stream's key's
// slot and start before handler runs, and gives the slot back when the
// stream's handler returns.
func StreamServer(lim *httpgate.Limiter, key Key) grpc.StreamServerInterceptor {
	return func(srv interface{}, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, end, err := hold(ss.Context(), lim, key, info.FullMethod)
		if err != nil {
			return err
		}
		defer end()
		return handler(srv, &stream{ServerStream: ss, ctx: ctx})
	}
}

// UnaryClient returns a client interceptor that takes the call's key's
// slot and start before the call goes out, and gives the slot back when it
// returns. A refused call fails with the status a server interceptor
// would give, and never reaches the server; errors.As finds the
// *httpgate.FullError in it.
func UnaryClient(lim *httpgate.Limiter, key Key) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, end, err := hold(ctx, lim, key, method)
		if err != nil {
			return err
		}
		defer end()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// stream is a ServerStream whose context ends when its lease does.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// hold takes method's key's slot and start under ctx (lim.Hold), or
// returns the call's error status.
func hold(ctx context.Context, lim *httpgate.Limiter, key Key, method string) (context.Context, func(), error) {
	k := ""
	if key != nil {
		k = key(ctx, method)
	}
	hctx, release, err := lim.Hold(ctx, k)
	if err != nil {
		return nil, nil, refusal(ctx, err)
	}
	return hctx, release, nil
}

// refused is the error of a call Acquire refused with err: it carries the
// call's status and unwraps to err.
type refused struct {
	st  *status.Status
	err error
}

func (r *refused) Error() string              { return r.st.Err().Error() }
func (r *refused) GRPCStatus() *status.Status { return r.st }
func (r *refused) Unwrap() error              { return r.err }

// refusal maps Acquire's err: a full key to ResourceExhausted with its
// retry delay (at least a second), the call's own context ending to its
// status, anything else (Redis failing, with FailOpen off) to Unavailable
// with a delay of httpgate.DownRetryAfter.
func refusal(ctx context.Context, err error) error {
	var full *httpgate.FullError
	switch {
	case errors.As(err, &full):
		st := retryIn(status.New(codes.ResourceExhausted, err.Error()), max(full.RetryAfter, time.Second))
		return &refused{st: st, err: err}
	case ctx.Err() != nil:
		return &refused{st: status.FromContextError(err), err: err}
	}
	st := retryIn(status.New(codes.Unavailable, err.Error()), httpgate.DownRetryAfter)
	return &refused{st: st, err: err}
}

// retryIn returns st with an errdetails.RetryInfo of delay.
func retryIn(st *status.Status, delay time.Duration) *status.Status {
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); err == nil {
		return d
	}
	return st
}
