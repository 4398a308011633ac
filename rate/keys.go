package rate

import (
	"strconv"

	"github.com/redsem/redsem/internal/engine"
)

// keys are a gate's Redis keys, all under <prefix>{<encoded name>}:rate:
// (see the package documentation and internal/engine/lua/rate_common.lua).
type keys struct {
	base    string
	meta    string
	holders string
	queue   string
	waits   string
	logs    [MaxLimits]string
}

func newKeys(prefix, name string) keys {
	base := engine.RateBase(prefix, name)
	k := keys{
		base:    base,
		meta:    base + "meta",
		holders: base + "holders",
		queue:   base + "queue",
		waits:   base + "waits",
	}
	for i := range k.logs {
		k.logs[i] = base + "log:" + strconv.Itoa(i+1)
	}
	return k
}

// The scripts take engine.RateKeys keys for a start (RateStateKeys and the
// doorbell) and engine.RateStateKeys for the others: every limit's log is
// passed, used or not, so that the count is fixed.

// state returns the keys of the gate's state: meta, holders, queue, waits
// and the logs.
func (k keys) state() []interface{} {
	out := []interface{}{k.meta, k.holders, k.queue, k.waits}
	for _, l := range k.logs {
		out = append(out, l)
	}
	return out
}

// args returns the keys rate_take.lua and rate_abort.lua take for
// acquisition acq: the state, then acq's doorbell.
func (k keys) args(acq string) []interface{} {
	return append(k.state(), k.inbox(acq))
}

// inbox is acquisition acq's doorbell: a waiter sleeps in BLPOP on it.
func (k keys) inbox(acq string) string { return k.base + "in:" + acq }
