package redsem

import (
	"testing"

	"github.com/redsem/redsem/internal/redistest"
)

// keyValue is one key's type and content (redistest.KeyValue).
type keyValue = redistest.KeyValue

// snapshot reads every key of the database with its content.
func (b *backend) snapshot(t testing.TB) map[string]keyValue {
	t.Helper()
	return redistest.Snapshot(t, b.addr)
}

// write replaces key k with value kv (as read by snapshot).
func (b *backend) write(t testing.TB, k string, kv keyValue) {
	t.Helper()
	redistest.Write(t, b.addr, k, kv)
}
