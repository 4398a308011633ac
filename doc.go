// Package redsem provides counting semaphores, mutexes and read-write locks
// shared through Redis: "at most N of us at once, across all machines".
//
// A Semaphore of size N is a Redis list of N tokens. Acquire takes one and
// returns a Lease; Release gives it back. Waiters sleep in Redis (BLMOVE)
// and are served first come, first served; nobody polls. A Mutex is the
// size-1 case, an RWMutex is many readers or one writer, AcquireN takes k
// tokens at once. A lease refreshes itself while its process lives and ends
// one TTL after its process dies.
//
// # Guarantees
//
//   - At most N leases exist at any moment, as long as Redis keeps its data.
//   - No token is lost: a client killed at any point, a cancelled context or a
//     dropped connection leaves the semaphore whole within one TTL at most.
//   - A lease's local deadline (Valid, Done) falls no later than Redis's.
//   - Fences (Lease.Fence) strictly increase; pass them to what you guard.
//
// Asynchronous replication and a restart without persistence can break
// these; docs/design.md says how, and holds the model, the keys and the
// full guarantees. Package admin is the operators' side (status, check,
// repair, resize, fleet scans); package rate limits how often things start.
package redsem
