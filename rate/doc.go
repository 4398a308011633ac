// Package rate limits how often something starts, across every process that
// shares a Redis: a Gate admits at most n units in any window of length per
// ("at most 100 calls per second to the partner API"), and a Quota holds
// every start to several such limits at once ("500 requests and 200,000
// tokens per minute"). A start takes one unit (Wait, Allow) or several
// (WaitN, AllowN), all at once or none. WaitN queues first come, first
// served, and sleeps in Redis; AllowN never waits and says when to retry.
// SetRate and SetLimits change the rate for every client at once. It runs on
// the machinery of package redsem's semaphores and shares their prefix,
// name encoding and error values; Gate.WaitHolding takes a start for a
// semaphore slot already held, to cap calls in flight too.
//
// A Gate takes only this package's options (Option): a semaphore's, such as
// redsem.WithTTL, has no meaning here and does not compile.
//
// # Several quotas in one call
//
// Limits that one call must respect together (an API's requests per minute
// and tokens per minute) are one Quota, named once, with up to MaxLimits
// limits identified by position:
//
//	q, _ := rate.NewQuota(pool, "llm", []rate.Limit{{N: 500, Per: time.Minute}, {N: 200_000, Per: time.Minute}})
//	st, err := q.WaitN(ctx, 1, 1200) // 1 request and 1,200 tokens, from both or neither
//
// All its limits live under the one hash tag {llm}, so the call is one
// script on one Redis Cluster slot and takes from every limit atomically,
// or from none. A Gate is a Quota of one limit; a Gate and a Quota of the
// same name are the same state, and must agree on the number of limits
// (ErrRateMismatch otherwise).
//
// # Keys
//
// All under the name's hash tag, so a gate or quota lives in one Redis
// Cluster slot, the slot of a semaphore of the same name, and never on one
// of its keys:
//
//	<prefix>{<name>}:rate:meta     hash: each limit's n, per and running sums, last grant, timer
//	<prefix>{<name>}:rate:holders  hash: grants (time, units) and queued requests
//	<prefix>{<name>}:rate:log:<i>  zset: limit i's grants in its window, by running sum
//	<prefix>{<name>}:rate:queue    list: waiting acquisitions, oldest first
//	<prefix>{<name>}:rate:waits    zset: waiter liveness deadlines, tombstones
//	<prefix>{<name>}:rate:in:<id>  list: a waiter's doorbell
//
// internal/engine/lua/rate_common.lua says what each field holds. This
// package deletes nothing: admin.Handle.Delete removes a gate with the rest
// of its name, and with WithIdleExpiry an idle gate's keys expire (all at
// once; internal/engine/lua/rate_idle.lua). A gate
// of the layout of redsem v0.1.0 (a token list and one lease per start) is
// upgraded by the first start of this version, which counts the old window
// as full: no more than the old rate is admitted, and capacity comes back
// at most one window later. Clients of v0.1.0 then fail with ErrCorrupt on
// it rather than share it; stop them before starting new ones.
package rate
