package rate

import "github.com/redsem/redsem/internal/engine"

// keys are a gate's Redis keys, all under <prefix>{<encoded name>}:rate:
// (see the package documentation). The layout is the semaphore's plus a
// queue and one doorbell per waiter, so status.lua reads both.
type keys struct {
	base    string
	meta    string
	tokens  string
	leases  string
	holders string
	queue   string
	waits   string
}

func newKeys(prefix, name string) keys {
	base := engine.RateBase(prefix, name)
	return keys{
		base:    base,
		meta:    base + "meta",
		tokens:  base + "tokens",
		leases:  base + "leases",
		holders: base + "holders",
		queue:   base + "queue",
		waits:   base + "waits",
	}
}

// keyCount is how many keys every rate script takes (see rate_common.lua).
const keyCount = 7

// args returns the keys the rate scripts take for acquisition acq: the
// last one is acq's doorbell.
func (k keys) args(acq string) []interface{} {
	return []interface{}{k.meta, k.tokens, k.leases, k.holders, k.queue, k.waits, k.inbox(acq)}
}

// inbox is acquisition acq's doorbell: a waiter sleeps in BLPOP on it.
func (k keys) inbox(acq string) string { return k.base + "in:" + acq }

// statusArgs are status.lua's keys, the semaphore's five in the same order.
func (k keys) statusArgs() []interface{} {
	return []interface{}{k.meta, k.tokens, k.leases, k.holders, k.waits}
}
