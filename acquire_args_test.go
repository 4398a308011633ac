package redsem

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
)

// acquire.lua's optional arguments are left out at their defaults (each
// costs Redis time on every call): 6 keys and 8 arguments.
func TestSemaphore_acquireCall_defaultsLeftOut(t *testing.T) {
	t.Parallel()
	s, err := NewSemaphore(newPool(t, miniredisT(t).Addr()), "defaults", 2)
	require.NoError(t, err)
	require.Len(t, s.acquireCall(engine.NewAcqID(), 0, "fresh").KeysAndArgs, 14)
}
