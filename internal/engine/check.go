package engine

import (
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"
)

// CheckPool rejects a nil pool, including a nil *redis.Pool in a non-nil
// interface. what names it in the error ("pool", "blocking pool").
func CheckPool(pool Pool, what string) error {
	if pool == nil {
		return fmt.Errorf("%w: nil %s", ErrInvalidOption, what)
	}
	if p, ok := pool.(*redis.Pool); ok && p == nil {
		return fmt.Errorf("%w: nil %s", ErrInvalidOption, what)
	}
	return nil
}

// CheckGrace rejects a grace outside 0 to one hour.
func CheckGrace(grace time.Duration) error {
	if grace < 0 || grace > time.Hour {
		return fmt.Errorf("%w: grace %v is not between 0 and 1h", ErrInvalidOption, grace)
	}
	return nil
}
