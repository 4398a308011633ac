package admin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem/internal/engine"
)

var (
	// ErrEvictingServer is returned by CheckServer when Redis may evict keys
	// without a TTL (maxmemory-policy allkeys-*): it could silently delete a
	// semaphore's keys under memory pressure and break its guarantees.
	ErrEvictingServer = errors.New("redsem: redis may evict semaphore keys")

	// ErrServerTooOld is returned by CheckServer for Redis older than 6.2,
	// which lacks BLMOVE.
	ErrServerTooOld = errors.New("redsem: redis is older than 6.2")

	// ErrNotChecked is wrapped by CheckServer's error when the server
	// refuses INFO to this user (the least-privilege ACL of ACLCommands
	// leaves it out): the check did not run, so it did not pass either.
	// Allow +info to the user that runs the check, or run it once as
	// another user; treat it as a warning if you must start anyway.
	ErrNotChecked = errors.New("redsem: server not checked")
)

// CheckServer reads INFO from the server behind pool and reports settings
// under which redsem cannot keep its promises: a version older than 6.2
// (ErrServerTooOld) or a maxmemory-policy that may evict keys without a TTL
// (ErrEvictingServer; noeviction and volatile-* are fine). Call it once at
// startup; it is two round trips. When the server refuses INFO to this user
// (an ACL without +info, as ACLCommands' is), it cannot tell, and says so:
// its error wraps ErrNotChecked and the server's refusal. nil means the
// server was checked and is fine.
func CheckServer(ctx context.Context, pool Pool) error {
	conn, err := pool.GetContext(ctx)
	if err != nil {
		return fmt.Errorf("redsem: check server: %w", err)
	}
	defer conn.Close()
	info, err := redis.String(redis.DoContext(conn, ctx, "INFO", "server"))
	if err != nil {
		if engine.IsRedisError(err) {
			return notChecked("INFO server", err)
		}
		return fmt.Errorf("redsem: check server: %w", err)
	}
	if v := infoField(info, "redis_version"); v != "" && versionBelow(v, 6, 2) {
		return fmt.Errorf("%w: version %s", ErrServerTooOld, v)
	}
	mem, err := redis.String(redis.DoContext(conn, ctx, "INFO", "memory"))
	if err != nil {
		if engine.IsRedisError(err) {
			return notChecked("INFO memory", err)
		}
		return fmt.Errorf("redsem: check server: %w", err)
	}
	if p := infoField(mem, "maxmemory_policy"); strings.HasPrefix(p, "allkeys-") {
		return fmt.Errorf("%w: maxmemory-policy is %s; use noeviction (or a volatile-* policy) for the semaphore's database", ErrEvictingServer, p)
	}
	return nil
}

// notChecked is CheckServer's error when Redis refused cmd with err.
func notChecked(cmd string, err error) error {
	return fmt.Errorf("%w: %s refused (%w); allow +info to this user to check the version and maxmemory-policy", ErrNotChecked, cmd, err)
}

func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

func versionBelow(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma < major || (ma == major && mi < minor)
}
