package redsem_test

import (
	"testing"

	"github.com/redsem/redsem/internal/behaviour"
	"github.com/redsem/redsem/internal/redistest"
)

// TestBehaviour_redigo holds redigo's pool to the behaviour suite, on a real
// redis-server (the goredis module holds go-redis to the same suite).
func TestBehaviour_redigo(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	behaviour.Run(t, behaviour.Target{Pool: s.Pool(t)})
}
