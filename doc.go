// Package redsem provides counting semaphores and mutexes shared through
// Redis: "at most N of us at once, across all machines".
//
// # Model
//
// A semaphore of size N is a Redis list of N tokens, created atomically by
// the first client that uses it. Acquire takes a token and records a lease on
// it; Release gives the token back. A Mutex is the size-1 case.
//
// An uncontended Acquire is one round trip: one Lua script reclaims expired
// leases, pops a token, records the lease (scored by Redis TIME) and hands
// out a fence. When no token is free the client blocks in Redis: it writes
// BLMOVE from the token list into a pending list of its own and, in the same
// write, the same script. Redis serves blocked clients first come, first
// served; when a token reaches the waiter, Redis runs the script right behind
// the move, so the lease exists on the server before the waiter reads a byte.
// Waiters never poll. A waiter's block is capped at the earliest lease
// deadline, so the waiters themselves reclaim the tokens of crashed holders:
// no daemon is needed.
//
// Every blocking acquisition (Acquire, AcquireN and the rate gate's Wait)
// runs one driver (internal/engine, driver.go): the pipelined wait, the
// start-over after a broken connection, settling by acquisition id after a
// lost reply, and the context's end are written once, and each protocol
// supplies its scripts and what their replies mean. So every kind of wait
// whose context ends returns within the same bound, 250ms after that end
// even when Redis does not answer, and the settling it starts goes on in the
// background for at most 5s.
//
// AcquireN takes k tokens, all or nothing. Weighted requests queue for a
// single collector ticket; the collector gathers tokens as leases of its own
// (fence 0), each recorded once as it arrives, so that k tokens cost O(k) of
// Redis time, and seals them into one lease when it has k. Weighted requests
// check in every half second whatever their block time, so a dead
// collector's tokens and ticket pass on within about a second.
//
// # Guarantees
//
//   - At most N leases exist at any moment, as long as Redis keeps its data.
//   - No token is lost. A client killed at any point, a cancelled context or a
//     dropped connection leaves the semaphore back at N tokens within one TTL
//     (the lease expires), within one wait plus the grace (a token moved to
//     a waiter's pending list whose script never ran), or within about a
//     second (the tokens a weighted collector had gathered).
//   - Release, Refresh and reclaim run as scripts gated by the acquisition's
//     id: a double release, or the release of a lease that expired and was
//     handed on, never adds a token. Refresh never revives an expired lease.
//   - Leases expire by Redis server time only. A lease's local deadline
//     (Lease.Deadline, Valid, Done) falls no later than the server's,
//     computed from the reply's server time and this process's monotonic clock.
//   - Tokens carry an epoch; forged, stale or duplicated tokens pushed onto
//     the list are dropped when popped and never make an extra holder.
//   - Fences (Lease.Fence) strictly increase across the acquisitions of a
//     semaphore.
//   - With WithIdleExpiry(d), only an idle semaphore (no lease, no waiter,
//     no weighted request, no shrink draining) has keys that expire, d after
//     it became idle; any use before then removes the expiry in the same
//     script, and a use after creates it again, fences above every earlier
//     one. For a name in use nothing changes.
//
// Leases give efficiency-grade mutual exclusion: a holder that stalls past
// its lease (GC pause, SIGSTOP) can still act after its successor started.
// Where that matters, pass Lease.Fence to the guarded resource and have it
// refuse older fences.
//
// What Redis itself cannot promise: with asynchronous replication a failover
// can lose the last acquisitions (two holders of one token); without
// persistence a restart loses every lease, and the next Acquire recreates the
// semaphore with N fresh tokens while old holders may still run until their
// local deadlines. An allkeys-* maxmemory-policy may evict the keys
// (admin.CheckServer reports it).
//
// # Leases and refreshing
//
// A lease refreshes itself in the background by default, each time a third
// of its TTL has passed, for as long as its holder lives and has not
// released it, like Redisson's lock watchdog and etcd's sessions: a live
// holder keeps its slot, and a crashed one (its process gone, or cut off
// from Redis) loses it within one TTL (WithTTL, default 30s), which is then
// the bound on recovery. Lease.Done and Lease.Context end when a refresh
// finds the lease gone, or when refreshes keep failing until the local
// deadline. WithFixedTTL makes leases fixed instead: a lease lives its TTL
// and then ends unless the holder calls Refresh, so that no hold ever
// outlasts the TTL. TTLs range from MinTTL (20ms) to MaxTTL.
//
// Release and Refresh act on every token of a lease at once, 256 tokens a
// script for a large lease (AcquireN), one script after another. Release
// never pushes a second copy of a token: a lease that expired but was not
// reclaimed yet is released normally; one whose tokens were partly
// reclaimed gives back the rest and returns ErrLeaseLost. A Release that
// failed on a connection error may or may not have taken effect, so the
// lease ends on this side (Valid false, Done closed); calling Release again
// goes on with the tokens not given back yet. Only an error reply to its
// first script (a key of the wrong type) leaves the lease held.
//
// Refresh lowers the local deadline at once to the earliest the new server
// deadline can be, and raises it only when Redis confirms, so a lost reply
// or two refreshes on the wire together never leave a local deadline after
// the server's. A large lease's refresh raises it once every run succeeded,
// to the earliest of their deadlines; a run that finds the lease lost, or a
// refresh that outlives the local deadline between two runs, ends the lease
// and gives back what Redis still records for it.
//
// # Read-write locks
//
// RWMutex is a read-write lock on the same machinery: any number of read
// leases (RLock) or one write lease (Lock), granted first come, first
// served with the readers at the head of the queue let in together, to
// waiters that sleep in BLPOP on doorbells of their own and are rung by the
// release that lets them in. Its leases are Leases, with the same contract,
// and a write lease's fence is above every earlier grant's, reads included.
//
// # Rate gates and operators
//
// Package github.com/redsem/redsem/rate limits how often something starts
// (at most n units per interval, or several such limits at once, across
// processes, with rate changes at run time) on the same machinery
// and under the same prefix; rate.Gate.WaitHolding takes a start for a
// semaphore slot already held (a slot, then a start). Options of this
// package (Option) configure a Semaphore or a Mutex; a rate gate takes
// rate.Option, so neither can be given the other's.
//
// Package github.com/redsem/redsem/admin is the operators' side: it reads,
// checks, repairs, resizes, reclaims and deletes a semaphore without knowing
// its size (admin.New), lists every name under a prefix (admin.ReadFleet),
// checks the server and lists the Redis commands a user needs; the redsem
// command and the exporter are built on it.
//
// # Keys
//
// Every key of a semaphore shares the hash tag {<encoded name>}, so it works
// on Redis Cluster (one slot per semaphore):
//
//	<prefix>{<name>}:meta      hash: size, epoch, fence, due, rejected, created; idle (the idle
//	                           expiry, WithIdleExpiry) and, while the keys expire, exp; while a shrink
//	                           drains over, held and h:1..h:<held>, the withheld tokens
//	                           (admin's Resize); while a weighted acquisition collects, coll and seal
//	                           (AcquireN)
//	<prefix>{<name>}:tokens    list: free tokens "<epoch>:<slot>"
//	<prefix>{<name>}:leases    zset: token -> lease deadline (ms, Redis TIME)
//	<prefix>{<name>}:holders   hash: t:<token> -> acqID|fence|granted|label, a:<acqID> -> its
//	                           token(s, space separated), x:<acqID> tombstones
//	<prefix>{<name>}:waits     zset: blocked acquisitions and tombstones
//	<prefix>{<name>}:pend:<id> list: a blocked waiter's BLMOVE destination
//	<prefix>{<name>}:wqueue    list: weighted acquisitions waiting for the collector ticket
//	<prefix>{<name>}:bell:<id> list: a weighted waiter's doorbell (with a TTL)
//	<prefix>{<name>}:part:<id> list: the tokens a weighted collector has so far (each a lease)
//
// An RWMutex of the same name keeps its keys under <prefix>{<name>}:rw:
// (meta, leases and holders by acquisition id, a queue list, waits, and a
// doorbell per waiter; see docs/rwmutex.md), in the same slot and never on a
// semaphore's key.
//
// A rate gate (package rate) of the same name keeps its own keys under
// <prefix>{<name>}:rate: (its package documentation lists them), in the
// same slot and never on a semaphore's key.
//
// The prefix defaults to "redsem:". Names may hold any bytes: bytes other
// than ASCII letters, digits and "-_.:/@+=," are written as %XX.
//
// A Redis user needs only the commands admin.ACLCommands lists, on the keys
// "<prefix>*", and no channel: every operation runs as such a user.
//
// # Concurrency
//
// Semaphore, Mutex, RWMutex and Lease are safe for concurrent use. Share one
// Semaphore per name in a process: goroutines waiting on it queue in the
// process, first come, first served, behind one blocking Redis call
// (WithWaitConnections), so a thousand waiters hold one connection. Between
// processes Redis serves the blocked calls in arrival order. The read
// timeout of the connections a wait blocks on should be 0 or above 32s; with
// a shorter one, waits are cut into shorter blocks, and every new block
// loses its place in Redis's queue.
//
// # Metrics
//
// WithObserver reports waits, holds, timeouts, cancellations and lost
// leases; admin.Counters is a ready-made Observer that is also an
// expvar.Var. An admin.Handle's Status reads the cluster-wide picture from
// Redis, and admin.ReadFleet reads it for every semaphore and rate gate
// under a prefix (a bounded SCAN over their meta keys); redsem top, redsem
// check --all and the Prometheus exporter (module
// github.com/redsem/redsem/exporter) are built on it.
package redsem
