package cluster

import (
	"context"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Source is what WaitPool wraps: *redis.Pool, *Pool, or any redsem.Pool.
type Source interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// WaitPool wraps a connection source so that every write command, and every
// pipeline that holds one, is followed by WAIT replicas timeout on the same
// connection. It works with a single master and its replicas (a *redis.Pool)
// as well as with a *Pool, although for a Pool the WithWait option does the
// same. See the package documentation for what WAIT does and does not
// promise.
type WaitPool struct {
	src      Source
	replicas int
	timeout  time.Duration
}

// NewWaitPool returns src with WAIT after writes. replicas must be at least
// 1 and timeout between 1ms and 1s. The connections of src must implement
// redis.ConnWithContext and redis.ConnWithTimeout, as redigo's do.
func NewWaitPool(src Source, replicas int, timeout time.Duration) (*WaitPool, error) {
	if src == nil {
		return nil, ErrNoNode
	}
	if err := checkWait(replicas, timeout); err != nil {
		return nil, err
	}
	return &WaitPool{src: src, replicas: replicas, timeout: timeout}, nil
}

// GetContext returns a connection of the wrapped source that waits for
// replicas after writes.
func (w *WaitPool) GetContext(ctx context.Context) (redis.Conn, error) {
	c, err := w.src.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	return newWaitConn(c, w.replicas, w.timeout), nil
}

// waitConn appends WAIT after writes. In Do it is a second round trip; in a
// pipeline it is sent with the pipeline's Flush and its reply is read, and
// checked, together with the reply before it.
type waitConn struct {
	inner     redis.Conn
	replicas  int
	timeoutMs int64
	dirty     bool   // a write was sent since the last Flush
	queue     []bool // per outstanding reply: true for our own WAIT
}

func newWaitConn(inner redis.Conn, replicas int, timeout time.Duration) *waitConn {
	return &waitConn{inner: inner, replicas: replicas, timeoutMs: timeout.Milliseconds()}
}

func (w *waitConn) Close() error { return w.inner.Close() }
func (w *waitConn) Err() error   { return w.inner.Err() }

// noCtx stands for "no context": Do and DoWithTimeout keep the node
// connection's own read timeout, as redigo's do.
var noCtx context.Context

func (w *waitConn) Do(cmd string, args ...interface{}) (interface{}, error) {
	return w.do(noCtx, 0, cmd, args)
}

func (w *waitConn) DoContext(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	return w.do(ctx, 0, cmd, args)
}

func (w *waitConn) DoWithTimeout(timeout time.Duration, cmd string, args ...interface{}) (interface{}, error) {
	return w.do(noCtx, timeout, cmd, args)
}

func (w *waitConn) do(ctx context.Context, timeout time.Duration, cmd string, args []interface{}) (interface{}, error) {
	if len(w.queue) > 0 || w.dirty || cmd == "" {
		// A pipeline is in flight: Do reads its replies (redigo semantics).
		w.queue, w.dirty = nil, false
		return rawDo(w.inner, ctx, timeout, cmd, args)
	}
	v, err := rawDo(w.inner, ctx, timeout, cmd, args)
	if err != nil || !isWrite(cmd) {
		return v, err
	}
	n, werr := redis.Int(rawDo(w.inner, ctx, timeout, "WAIT", []interface{}{w.replicas, w.timeoutMs}))
	if werr != nil {
		return v, &NotReplicatedError{Want: w.replicas, Err: werr}
	}
	if n < w.replicas {
		return v, &NotReplicatedError{Want: w.replicas, Acked: n}
	}
	return v, nil
}

func (w *waitConn) Send(cmd string, args ...interface{}) error {
	if err := w.inner.Send(cmd, args...); err != nil {
		return err
	}
	w.queue = append(w.queue, false)
	if isWrite(cmd) {
		w.dirty = true
	}
	return nil
}

func (w *waitConn) Flush() error {
	if w.dirty {
		if err := w.inner.Send("WAIT", w.replicas, w.timeoutMs); err != nil {
			return err
		}
		w.queue = append(w.queue, true)
		w.dirty = false
	}
	return w.inner.Flush()
}

func (w *waitConn) Receive() (interface{}, error) {
	return w.receive(func() (interface{}, error) { return w.inner.Receive() })
}

func (w *waitConn) ReceiveContext(ctx context.Context) (interface{}, error) {
	return w.receive(func() (interface{}, error) { return redis.ReceiveContext(w.inner, ctx) })
}

func (w *waitConn) ReceiveWithTimeout(timeout time.Duration) (interface{}, error) {
	return w.receive(func() (interface{}, error) { return redis.ReceiveWithTimeout(w.inner, timeout) })
}

func (w *waitConn) receive(read func() (interface{}, error)) (interface{}, error) {
	if len(w.queue) > 0 {
		w.queue = w.queue[1:]
	}
	v, err := read()
	if err != nil && !isRedisError(err) {
		w.queue = nil // the connection is broken: no WAIT reply will come
		return v, err
	}
	if len(w.queue) > 0 && w.queue[0] {
		w.queue = w.queue[1:]
		n, werr := redis.Int(read())
		if err == nil && werr != nil {
			return v, &NotReplicatedError{Want: w.replicas, Err: werr}
		}
		if err == nil && n < w.replicas {
			return v, &NotReplicatedError{Want: w.replicas, Acked: n}
		}
	}
	return v, err
}
