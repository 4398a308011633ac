package admin

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// Status calls a semaphore corrupt exactly when an acquisition does, in
// the same words: a meta record of the wrong shape, or tokens and leases
// without one. Otherwise it reads it.
func TestHandle_Status_corrupt(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		for i, tc := range []struct {
			what    string
			corrupt bool
			spoil   func(meta, tokens, leases string)
		}{
			{"sound", false, func(string, string, string) {}},
			{"size abc", true, func(m, _, _ string) { b.do(t, "HSET", m, "size", "abc") }},
			{"size 0", true, func(m, _, _ string) { b.do(t, "HSET", m, "size", "0") }},
			{"size 2.5", true, func(m, _, _ string) { b.do(t, "HSET", m, "size", "2.5") }},
			{"size 100001", true, func(m, _, _ string) { b.do(t, "HSET", m, "size", "100001") }},
			{"size 0x3", false, func(m, _, _ string) { b.do(t, "HSET", m, "size", "0x3") }},
			{"size 3.0", false, func(m, _, _ string) { b.do(t, "HSET", m, "size", "3.0") }},
			{"no epoch", true, func(m, _, _ string) { b.do(t, "HDEL", m, "gen") }},
			{"no fence", true, func(m, _, _ string) { b.do(t, "HDEL", m, "fence") }},
			{"fence x", true, func(m, _, _ string) { b.do(t, "HSET", m, "fence", "x") }},
			{"fence too large", true, func(m, _, _ string) { b.do(t, "HSET", m, "fence", "9000000000000000") }},
			{"no meta, tokens left", true, func(m, _, _ string) { b.do(t, "DEL", m) }},
			{"no meta, a lease left", true, func(m, tok, _ string) { b.do(t, "DEL", m, tok) }},
			{"no meta, tokens nor leases", false, func(m, tok, l string) { b.do(t, "DEL", m, tok, l) }},
		} {
			name := fmt.Sprintf("c%d", i)
			s := newSem(t, b, name, 3, redsem.WithAdoptSize())
			_, err := s.TryAcquire(ctx)
			require.NoError(t, err, tc.what)
			tc.spoil(key(redsem.DefaultPrefix, name, "meta"), key(redsem.DefaultPrefix, name, "tokens"), key(redsem.DefaultPrefix, name, "leases"))
			a, err := New(b.pool, redsem.DefaultPrefix, name)
			require.NoError(t, err)
			_, statusErr := a.Status(ctx)
			_, acqErr := s.TryAcquire(ctx)
			if !tc.corrupt {
				assert.NoError(t, statusErr, tc.what)
				assert.False(t, errors.Is(acqErr, redsem.ErrCorrupt), "%s: %v", tc.what, acqErr)
				continue
			}
			require.ErrorIs(t, acqErr, redsem.ErrCorrupt, tc.what)
			if assert.ErrorIs(t, statusErr, redsem.ErrCorrupt, tc.what) {
				assert.Equal(t, acqErr.Error(), statusErr.Error(), tc.what)
			}
		}
	})
}
