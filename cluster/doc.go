// Package cluster lets redsem semaphores and mutexes run on Redis Cluster.
//
// A Pool is a connection source built on redigo: it keeps the slot map
// (CLUSTER SLOTS) and one redigo pool per master, and satisfies redsem.Pool,
// so the semaphore API does not change:
//
//	p, err := cluster.New(ctx, []string{"10.0.0.1:7000", "10.0.0.2:7000"},
//		cluster.WithDialOptions(redis.DialPassword(pw)))
//	if err != nil { ... }
//	defer p.Close()
//	sem, err := redsem.NewSemaphore(p, "reports", 10)
//
// Every key of one semaphore shares the hash tag {<name>}, so a semaphore
// lives in one slot on one master, and different semaphores spread over the
// masters. One semaphore does not get faster on a cluster; many do.
//
// # Routing
//
// GetContext has no key, so it returns a routing connection, which picks the
// node from the first command that carries a key: the first key after
// numkeys for EVAL and EVALSHA, the first argument for BLMOVE, LPUSH and the
// like. Commands without a key (PING, TIME, INFO, WAIT) go to the node the
// connection already uses, or to any master. Do and DoContext follow MOVED
// (and update the map) and ASK (sending ASKING first), and retry TRYAGAIN,
// CLUSTERDOWN and LOADING with backoff from 10ms to 500ms, at most
// WithMaxRedirects times (default 16). Redis sends all of these before it
// runs a command, so following them never runs a command twice. A
// connection error is returned as is, since the command may have run; the
// node's idle connections are dropped and the map reloaded.
//
// A pipeline (Send, Flush, Receive) goes to the node of its first keyed
// command and stays there. A redirection inside a pipeline is not followed:
// it comes back as a *RedirectError, which is deliberately not a redis.Error,
// so that the caller treats the pipeline as broken. That is what redsem's
// blocked Acquire needs: its wait is BLMOVE and the lease script in one
// write; when the slot moves or the master is demoted while it waits, Redis
// answers MOVED, UNBLOCKED or TRYAGAIN, and Acquire settles that acquisition
// by its id on a fresh connection (now routed to the new master), which gives
// back anything the wait may have moved, and waits again within its context.
// No token is lost and none is granted twice; the waiter loses its place in
// the FIFO queue.
//
// # Resharding
//
// While a semaphore's slot migrates (CLUSTER SETSLOT MIGRATING/IMPORTING,
// MIGRATE), its multi-key scripts get TRYAGAIN (a waiter's pending list
// never exists yet on the target) and are retried until the slot's owner
// changes, typically well under a second; waiters blocked on the source are
// redirected once SETSLOT NODE is done. Pending lists left by dead waiters
// move with the slot and are swept on the new master.
//
// A script that runs on the source of a migrating slot would fail at its
// first access to a key that is not there, even one it has just emptied
// itself, and keep the writes it made before, which could lose a token. So
// the general scripts first probe a key that never exists and, on a
// migrating slot, answer TRYAGAIN before their first write; this package
// retries it like any TRYAGAIN. The hot-path scripts need no probe: a fresh
// acquire declares its pending list, which never exists on the source, so
// Redis answers TRYAGAIN or ASK before running it; behind a BLMOVE, a
// put-back that fails falls back to the token list.
// TestReclaimDuringMigration and TestReleaseAndAcquireDuringMigration check
// that a migration loses nothing.
//
// # Failover
//
// A manual failover (CLUSTER FAILOVER on a replica, without FORCE or
// TAKEOVER) is coordinated: the master stops accepting writes, the replica
// catches up to its replication offset, then takes over. Nothing
// acknowledged is lost, and the semaphore guarantees hold unchanged: at most
// N holders, no token lost, blocked waiters redirected and waiting again.
//
// Any other failover (the master crashed or was partitioned away; FAILOVER
// FORCE or TAKEOVER) promotes a replica that may lack the master's last
// writes, because replication is asynchronous. For a semaphore that means:
//
//   - A lost acquisition: the token is free again on the new master and can be
//     granted to someone else while its first holder still works: a token with
//     two holders. The first holder's Release and Refresh then fail with
//     redsem.ErrLeaseLost and add no token. Use Lease.Fence where overlap
//     matters.
//   - A lost release: the token stays leased until its TTL, then is reclaimed.
//     A delay, never an extra holder.
//   - A lost creation: the next Acquire creates the semaphore again with a new
//     epoch; old holders get ErrLeaseLost.
//   - A partitioned master keeps accepting writes for up to
//     cluster-node-timeout while the majority promotes its replica: clients on
//     both sides can hold the same tokens, up to 2N holders in that window.
//
// No token stays lost for longer than one lease TTL plus the grace.
//
// # WAIT
//
// WithWait(replicas, timeout) (or NewWaitPool around any source, a single
// master with replicas included) follows every write, and every pipeline
// that holds one, with WAIT replicas timeout on the same node. A call then
// succeeds only if at least that many replicas acknowledged its write: an
// Acquire that returns a lease had its grant replicated, and a Release that
// returns nil had its release replicated. When they did not acknowledge in
// time the call fails with ErrNotReplicated; the write did happen on the
// master: Acquire settles it (the grant is kept only if the settle is
// acknowledged, otherwise it expires after its TTL), and Release may be
// called again.
//
// WAIT narrows the window; it does not close it. With more than one replica
// per master, the one promoted may not be one that acknowledged; a
// partitioned master with a replica on its side still acknowledges; and WAIT
// says nothing about disk (WAITAOF). Its cost is one more round trip to the
// master plus the replica's acknowledgement: on loopback the median
// uncontended Acquire went from about 110µs to 220µs and Release from 85µs to
// 200µs (TestCluster/Wait prints the figures).
//
// # Connections
//
// Every blocked Acquire holds one node connection while it waits: size
// WithPoolSize for your waiters, or give blocked Acquires their own Pool with
// redsem.WithBlockingPool. Leave the read timeout at 0 or above 32s (redsem
// blocks up to 30s). Tested against redis-server 7.0 with 3 masters and 3
// replicas on loopback.
package cluster
