package redsem

import (
	"context"

	"github.com/gomodule/redigo/redis"
)

// runScript runs script on conn under ctx. A context that can never end
// needs no watcher goroutine, so the plain call is used then.
func runScript(ctx context.Context, conn redis.Conn, script *redis.Script, keysAndArgs ...interface{}) (interface{}, error) {
	if ctx.Done() == nil {
		return script.Do(conn, keysAndArgs...)
	}
	return script.DoContext(ctx, conn, keysAndArgs...)
}

// call runs script on a connection from the semaphore's pool. A pooled
// connection may be dead (killed by CLIENT KILL, or from before a server
// restart) and fail on first use; when the failure is the connection's and
// ctx is still live, call runs the script once more on a fresh connection and
// reports retried. Only idempotent scripts go through call; whether the first
// attempt took effect is for the caller to judge.
func (s *Semaphore) call(ctx context.Context, script *redis.Script, keysAndArgs ...interface{}) (v interface{}, retried bool, err error) {
	for attempt := 0; ; attempt++ {
		var conn redis.Conn
		conn, err = s.pool.GetContext(ctx)
		if err != nil {
			return nil, retried, err
		}
		v, err = runScript(ctx, conn, script, keysAndArgs...)
		conn.Close()
		if err == nil || isRedisError(err) || ctxErr(ctx) != nil || attempt == 1 {
			return v, retried, err
		}
		retried = true
	}
}
