package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Pool is where the scripts' connections come from; redsem.Pool and
// rate.Pool have this method set.
type Pool interface {
	GetContext(ctx context.Context) (redis.Conn, error)
}

// RunScript runs script on conn under ctx. A context that can never end
// needs no watcher goroutine, so the plain call is used then.
func RunScript(ctx context.Context, conn redis.Conn, script *redis.Script, keysAndArgs ...interface{}) (interface{}, error) {
	if err := checkArity(script, keysAndArgs); err != nil {
		return nil, err
	}
	if ctx.Done() == nil {
		return script.Do(conn, keysAndArgs...)
	}
	return script.DoContext(ctx, conn, keysAndArgs...)
}

// Call runs script on a connection from pool. A pooled connection may be
// dead (killed by CLIENT KILL, or from before a server restart) and fail on
// first use; when the failure is the connection's and ctx is still live,
// Call runs the script once more on a fresh connection and reports retried.
// Only idempotent scripts go through Call; whether the first attempt took
// effect is for the caller to judge.
func Call(ctx context.Context, pool Pool, script *redis.Script, keysAndArgs ...interface{}) (v interface{}, retried bool, err error) {
	for attempt := 0; ; attempt++ {
		var conn redis.Conn
		conn, err = pool.GetContext(ctx)
		if err != nil {
			return nil, retried, err
		}
		v, err = RunScript(ctx, conn, script, keysAndArgs...)
		conn.Close()
		if err == nil || IsRedisError(err) || errors.Is(err, ErrArity) || CtxErr(ctx) != nil || attempt == 1 {
			return v, retried, err
		}
		retried = true
	}
}

// IsRedisError reports whether err is an error reply from Redis (the
// connection is fine) rather than a network or context error.
func IsRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// CtxErr is ctx.Err(), or context.DeadlineExceeded once the deadline has
// passed even if ctx's timer has not fired yet (a dial or read with the same
// deadline can fail first).
func CtxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// NewAcqID returns a random 128-bit acquisition id, in hex. Every
// acquisition carries one, chosen before its first command: its lease or
// start is recorded under it, and an acquisition whose reply was lost is
// settled by it.
func NewAcqID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("redsem: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}
