package redsem

import "github.com/redsem/redsem/internal/engine"

// keys holds the Redis keys of one semaphore. All of them share the hash tag
// {<encoded name>}, so they live in one Redis Cluster slot and every script
// touches a single slot.
type keys struct {
	base    string // <prefix>{<encoded name>}:
	meta    string // hash: size, epoch, fence, rejected, created
	tokens  string // list: free tokens
	leases  string // zset: token -> lease deadline (ms, Redis TIME)
	holders string // hash: t:<token> -> record, a:<acqID> -> token
	waits   string // zset: w:<acqID> pending-list sweep deadline, x:<acqID> tombstones
}

func newKeys(prefix, name string) keys {
	return keysAt(engine.KeyBase(prefix, name))
}

// keysAt returns the key set under base.
func keysAt(base string) keys {
	return keys{
		base:    base,
		meta:    base + "meta",
		tokens:  base + "tokens",
		leases:  base + "leases",
		holders: base + "holders",
		waits:   base + "waits",
	}
}

// pend is the list a blocked waiter's BLMOVE moves its token into.
func (k keys) pend(acqID string) string { return k.base + "pend:" + acqID }

// all returns the first n keys in the order the scripts expect them.
func (k keys) all(n int) []interface{} {
	ks := []interface{}{k.meta, k.tokens, k.leases, k.holders, k.waits}
	return ks[:n]
}

// checkName rejects names that are empty or longer than engine.MaxNameLen bytes
// (engine.CheckName).
func checkName(name string) error { return engine.CheckName(name) }

// printable quotes a name for error messages.
func printable(name string) string { return engine.Printable(name) }
