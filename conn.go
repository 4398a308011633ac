package redsem

import (
	"context"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

// runScript runs script on conn under ctx (engine.RunScript).
func runScript(ctx context.Context, conn redis.Conn, script *redis.Script, keysAndArgs ...interface{}) (interface{}, error) {
	return engine.RunScript(ctx, conn, script, keysAndArgs...)
}

// call runs script on a connection from the semaphore's pool, once more on
// a fresh connection when a pooled one turns out dead (engine.Call). Only
// idempotent scripts go through call; whether the first attempt took effect
// is for the caller to judge.
func (s *Semaphore) call(ctx context.Context, script *redis.Script, keysAndArgs ...interface{}) (v interface{}, retried bool, err error) {
	return engine.Call(ctx, s.pool, script, keysAndArgs...)
}

// isRedisError reports whether err is an error reply from Redis (the
// connection is fine) rather than a network or context error.
func isRedisError(err error) bool { return engine.IsRedisError(err) }
