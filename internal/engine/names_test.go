package engine

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeNameInvertsEncodeName(t *testing.T) {
	for c := 0; c < 256; c++ {
		name := string([]byte{byte(c)})
		got, ok := DecodeName(EncodeName(name))
		require.True(t, ok, "byte %#x", c)
		require.Equal(t, name, got, "byte %#x", c)
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 1000; i++ {
		b := make([]byte, 1+rng.Intn(40))
		rng.Read(b)
		got, ok := DecodeName(EncodeName(string(b)))
		require.True(t, ok)
		require.Equal(t, string(b), got)
	}
	// Only what EncodeName writes decodes: anything else would name a key
	// that no semaphore of the decoded name uses.
	for _, enc := range []string{"%41", "%4a", "%4", "%", "a%", "a b", "{", "}", "x%2", "%7b", "%GG", "é"} {
		_, ok := DecodeName(enc)
		assert.False(t, ok, "%q", enc)
	}
}
