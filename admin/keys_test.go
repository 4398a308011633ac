package admin

import (
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem"
)

// Kinds names the kinds whose meta key exists, a meta key of the wrong type
// included; Keys lists every key of a name, in-flight ones and ones of the
// wrong type included; Purge removes them all and nothing of another name.
func TestKindsKeysPurge(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ctx := ctxT(t, 20*time.Second)
		const p = redsem.DefaultPrefix
		h, err := New(b.pool, p, "x")
		require.NoError(t, err)
		kinds, err := h.Kinds(ctx)
		require.NoError(t, err)
		assert.Empty(t, kinds)

		_, err = newSem(t, b, "x", 2, redsem.WithFixedTTL()).TryAcquire(ctx)
		require.NoError(t, err)
		rw, err := redsem.NewRWMutex(b.pool, "x", redsem.WithFixedTTL())
		require.NoError(t, err)
		_, err = rw.TryRLock(ctx)
		require.NoError(t, err)
		_, err = newRateGate(t, b, "x", 5, time.Hour).Allow(ctx)
		require.NoError(t, err)
		// Keys of acquisitions in flight, as waiters leave them, and one
		// someone else wrote with the wrong type.
		b.do(t, "ZADD", key(p, "x", "waits"), 1, "w:s1")
		b.do(t, "RPUSH", key(p, "x", "pend:s1"), "tok")
		b.do(t, "RPUSH", key(p, "x", "wqueue"), "s2|2|x")
		b.do(t, "RPUSH", key(p, "x", "bell:s2"), "1")
		b.do(t, "RPUSH", key(p, "x", "rw:queue"), "r1")
		b.do(t, "RPUSH", key(p, "x", "rw:bell:r1"), "1")
		b.do(t, "RPUSH", key(p, "x", "rate:queue"), "g1")
		b.do(t, "RPUSH", key(p, "x", "rate:in:g1"), "1")
		b.do(t, "SET", key(p, "x", "tokens"), "not a list")
		// Another name, and a name that shares the prefix of this one's.
		_, err = newSem(t, b, "x2", 1, redsem.WithFixedTTL()).TryAcquire(ctx)
		require.NoError(t, err)
		others := b.keyCount(t)

		kinds, err = h.Kinds(ctx)
		require.NoError(t, err)
		assert.Equal(t, []Kind{KindSemaphore, KindRWMutex, KindRate}, kinds)
		keys, err := h.Keys(ctx)
		require.NoError(t, err)
		byName := map[string]Key{}
		for _, k := range keys {
			byName[k.Key] = k
		}
		for k, want := range map[string]Key{
			"meta": {Type: "hash", Kind: KindSemaphore}, "tokens": {Type: "string", Kind: KindSemaphore},
			"pend:s1": {Type: "list", Kind: KindSemaphore}, "bell:s2": {Type: "list", Kind: KindSemaphore},
			"rw:meta": {Type: "hash", Kind: KindRWMutex}, "rw:bell:r1": {Type: "list", Kind: KindRWMutex},
			"rate:meta": {Type: "hash", Kind: KindRate}, "rate:in:g1": {Type: "list", Kind: KindRate},
		} {
			want.Key = key(p, "x", k)
			assert.Equal(t, want, byName[want.Key], k)
		}
		n := len(keys)
		others -= n
		purged, err := h.Purge(ctx)
		require.NoError(t, err)
		sort.Slice(purged, func(i, j int) bool { return purged[i].Key < purged[j].Key })
		sort.Slice(keys, func(i, j int) bool { return keys[i].Key < keys[j].Key })
		assert.Equal(t, keys, purged)
		assert.Equal(t, others, b.keyCount(t), "only x2's keys are left")
		kinds, err = h.Kinds(ctx)
		require.NoError(t, err)
		assert.Empty(t, kinds)
		purged, err = h.Purge(ctx)
		require.NoError(t, err)
		assert.Empty(t, purged, "twice is fine")
	})
}
